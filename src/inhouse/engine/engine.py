"""LLMEngine: the synchronous engine, an ``EngineCore`` plus an ``OutputProcessor``.

``add_request`` validates and queues an ``EngineRequest``; ``step`` runs one batched
step on the core and turns its token-id news into text deltas; a stop string found
there finishes its sequence in the core before the next step. Used by tests and
benchmarks; the server runs the same two parts split across threads in ``AsyncEngine``.
"""

from __future__ import annotations

from inhouse.engine.config import EngineConfig
from inhouse.engine.core import EngineCore
from inhouse.engine.info import EngineInfo
from inhouse.engine.models.loader import LoadedModel
from inhouse.engine.output_processor import OutputProcessor
from inhouse.engine.outputs import CoreOutput, RequestOutput
from inhouse.engine.request import EngineRequest
from inhouse.engine.stats import EngineStats


class LLMEngine:
    """One model, one KV cache, one scheduler; text out, single-threaded."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.core = EngineCore(config, loaded)
        self.info: EngineInfo = self.core.info
        self.processor = OutputProcessor(self.info.tokenizer)

    def add_request(self, request: EngineRequest) -> None:
        """Validate and queue a request (``params.n`` sibling sequences)."""
        self.core.add(request)
        self.processor.add(request)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; its final output (None if unknown)."""
        news = self.core.abort(request_id)
        return None if news is None else self._process([news])[0]

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; return the news of every request it touched."""
        return self._process(self.core.step())

    def _process(self, news: list[CoreOutput]) -> list[RequestOutput]:
        outputs = []
        for item in news:
            output, finishes = self.processor.process(item)
            for finish in finishes:
                self.core.apply_finish(finish)
            if output is not None:
                outputs.append(output)
        return outputs

    def stats(self) -> EngineStats:
        return self.core.stats()
