"""Building what a ``ServerContext`` serves: engine, chat renderer, grammars, embedder."""

from __future__ import annotations

import logging
from pathlib import Path

from inhouse.engine.async_engine import AsyncEngine
from inhouse.engine.config import EngineConfig
from inhouse.engine.embedder import Embedder
from inhouse.engine.embedding_scheduler import EmbeddingScheduler
from inhouse.engine.structured import GrammarCompiler
from inhouse.server.chat_template import ChatRenderer
from inhouse.server.context import ServerContext
from inhouse.server.errors import ModelRefused
from inhouse.server.model_state import LoadedChat

log = logging.getLogger(__name__)

# What loading raises for a model that cannot be served as given: the loader's refusals
# (pickles, a missing source, an unsupported architecture or dtype, a KV budget too small:
# ValueErrors all), and files that cannot be read or parsed (OSError, as transformers
# raises for a missing tokenizer or an unreadable config.json).
UNSERVABLE = (ValueError, OSError)


def read_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file path, or the Jinja template text itself."""
    if value is None:
        return None
    path = Path(value)
    return path.read_text() if path.is_file() else value


class ContextLoader:
    """Loads the model and helpers for a context (run in a thread by the app): the context's
    model is ready once the chat model is, and its embeddings complete after."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.engine_config = engine_config

    def __call__(self, ctx: ServerContext) -> None:
        """The chat model (the server is ready then), then the embedding model: its
        transformers model code costs ~2 s of imports the chat path never needs, so
        ``/v1/embeddings`` waits for it instead of the whole server."""
        try:
            engine = AsyncEngine(self.engine_config)
            info = engine.info
            template = read_chat_template(ctx.config.chat_template) or info.chat_template
            renderer = ChatRenderer(
                info.tokenizer,
                template,
                ctx.model_name,
                info.refuse_surely_too_long,
                info.images,
                ctx.config.images_per_prompt,
                ctx.config.allowed_media_domains,
            )
            grammars = GrammarCompiler(info.tokenizer, info.vocab_size, info.eos_token_ids)
            engine.start()
        except Exception as exc:
            ctx.embeddings.set_exception(RuntimeError(f"the chat model failed first ({exc})"))
            if isinstance(exc, UNSERVABLE):
                raise ModelRefused(" ".join(str(exc).split())) from exc  # one line
            raise
        ctx.model.ready(LoadedChat(engine, renderer, grammars))
        if ctx.config.embedding_model is not None:
            try:
                embedder = Embedder(ctx.config.embedding_model, ctx.config.embedding_name)
                scheduler = EmbeddingScheduler(embedder)
            except Exception as exc:
                log.exception("loading the embedding model failed")
                ctx.embeddings.set_exception(exc)
            else:
                ctx.embeddings.set_result(scheduler)
