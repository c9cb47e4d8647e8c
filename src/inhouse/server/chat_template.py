"""Chat messages to prompt text through the model's Jinja chat template.

For a text model, text content parts are joined and image parts refused. For a
vision-language model, content goes to the template as parts (``{"type": "image"}`` where an
image is, as transformers' processors pass it), each image is read and prepared by the
model's image side, and the image token the template wrote for it becomes the processor's
placeholder. When the template has no notion of tools, tool definitions, earlier tool
calls and tool results are written in the Hermes convention of ``tools.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inhouse.api.chat import ChatMessage, TextPart, ToolDefinition
from inhouse.api.errors import APIError, invalid_request
from inhouse.api.image_url import ImageRefused, images_limit_message
from inhouse.engine.errors import EngineInputError
from inhouse.engine.fast_encode import encode
from inhouse.engine.images import ImageSide, PromptImage, place_images
from inhouse.plan.vision import DEFAULT_IMAGES_PER_PROMPT
from inhouse.server.image_parts import image_part_indices, read_image
from inhouse.server.request_params import engine_input_error
from inhouse.server.tools import tool_call_text, tool_response_text, tools_system_prompt


def template_sha256(template: str | None) -> str | None:
    """Hash of the template text, for ``/version``."""
    return hashlib.sha256(template.encode()).hexdigest() if template else None


@dataclass(slots=True, frozen=True)
class Prompt:
    """A chat prompt as the engine takes it: token ids, and its images placed among them."""

    token_ids: list[int]
    images: tuple[PromptImage, ...] = ()


class ChatRenderer:
    """Renders OpenAI messages with one chat template and one tokenizer (and a
    vision-language model's image side, with its images-per-prompt limit)."""

    def __init__(
        self,
        tokenizer: Any,
        template: str | None,
        model_name: str,
        refuse_surely_too_long: Callable[[str], None],
        images: ImageSide | None = None,
        images_per_prompt: int = DEFAULT_IMAGES_PER_PROMPT,
        image_url_hosts: frozenset[str] = frozenset(),
    ) -> None:
        self._tokenizer = tokenizer
        self._refuse_surely_too_long = refuse_surely_too_long  # EngineInfo's, before tokenizing
        self.template = template
        self._model_name = model_name
        self.supports_tools = bool(template) and "tools" in (template or "")
        self._images = images
        self._images_per_prompt = images_per_prompt
        self._image_url_hosts = image_url_hosts

    def render(
        self,
        messages: list[ChatMessage],
        tools: list[ToolDefinition] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``; raises a 400 :class:`APIError` on bad input."""
        if not self.template:
            raise invalid_request(
                f"The model {self._model_name!r} has no chat template; start the server "
                "with --chat-template, or use /v1/completions.",
                param="messages",
            )
        native_tools = bool(tools) and self.supports_tools
        conversation = [self._message(m, native_tools) for m in messages]
        if tools and not native_tools:
            conversation = _with_tools_in_system_prompt(conversation, tools_system_prompt(tools))
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if native_tools else None
        try:
            return self._tokenizer.apply_chat_template(
                conversation,
                chat_template=self.template,
                tools=tool_dicts,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **(template_kwargs or {}),
            )
        except APIError:
            raise
        except Exception as exc:  # a template's raise_exception() or a Jinja error
            raise invalid_request(
                f"The chat template cannot render these messages: {exc}", param="messages"
            ) from exc

    def token_ids(
        self,
        messages: list[ChatMessage],
        tools: list[ToolDefinition] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The prompt's token ids (see :meth:`prompt`)."""
        return self.prompt(messages, tools, add_generation_prompt, template_kwargs).token_ids

    def prompt(
        self,
        messages: list[ChatMessage],
        tools: list[ToolDefinition] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Prompt:
        """The prompt's token ids (:meth:`render`, then the tokenizer, no special tokens
        added: the template writes them) and its images; a 400 for a text too long by its
        length alone, and for an image that cannot be read or one too many."""
        pictures = self._read_images(messages)
        text = self.render(messages, tools, add_generation_prompt, template_kwargs)
        prepared: list[PromptImage] = []
        if pictures:
            assert self._images is not None
            try:
                text, prepared = self._images.with_placeholders(text, pictures)
            except EngineInputError as exc:
                raise invalid_request(str(exc), param="messages") from exc
        try:
            self._refuse_surely_too_long(text)
        except EngineInputError as exc:
            raise engine_input_error(exc) from exc
        ids = encode(self._tokenizer, text, add_special_tokens=False)
        if prepared:
            assert self._images is not None
            place_images(ids, prepared, self._images.image_token_id)
        return Prompt(ids, tuple(prepared))

    def _read_images(self, messages: list[ChatMessage]) -> list[Any]:
        """The request's images as PIL images, for a model that takes them (a text model's
        refusal comes from :meth:`_text`)."""
        if self._images is None:
            return []
        parts = image_part_indices(messages)
        if len(parts) > self._images_per_prompt:
            whose = f"model {self._model_name!r}"
            message = images_limit_message(
                len(parts), self._images_per_prompt, whose, "--limit-mm-per-prompt"
            )
            raise invalid_request(message, param="messages", code="too_many_images")
        try:
            return [
                read_image(part, self._image_url_hosts, f"messages[{i}].content[{j}]")
                for i, j, part in parts
            ]
        except ImageRefused as exc:
            raise invalid_request(str(exc), param=exc.param) from None

    def _message(self, message: ChatMessage, native_tools: bool) -> dict[str, Any]:
        out = self._text_message(message, native_tools)
        if self._images is None:
            return out
        # a vision model's template reads content as parts, as transformers' processors give it
        if isinstance(message.content, list) and not (message.role == "tool" or message.tool_calls):
            parts = [
                {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
                for p in message.content
            ]
            return {**out, "content": parts}
        return {**out, "content": [{"type": "text", "text": out["content"]}]}

    def _text_message(self, message: ChatMessage, native_tools: bool) -> dict[str, Any]:
        text = self._text(message)
        role = "system" if message.role == "developer" else message.role
        if native_tools:
            out: dict[str, Any] = {"role": role, "content": text}
            if message.tool_calls:
                out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
            if message.tool_call_id:
                out["tool_call_id"] = message.tool_call_id
            return out
        if role == "tool":
            return {"role": "user", "content": tool_response_text(text)}
        if message.tool_calls:
            calls = "\n".join(
                tool_call_text(c.function.name, c.function.arguments) for c in message.tool_calls
            )
            text = f"{text}\n{calls}" if text else calls
        return {"role": role, "content": text}

    def _text(self, message: ChatMessage) -> str:
        if message.content is None:
            return ""
        if isinstance(message.content, str):
            return message.content
        texts = []
        for part in message.content:
            if part.type != "image_url":
                texts.append(part.text)
            elif self._images is None:
                raise invalid_request(
                    f"The model {self._model_name!r} does not accept images: it is a "
                    "text-only model. Send text content parts only.",
                    param="messages",
                    code="image_input_not_supported",
                )
            elif message.role == "tool" or message.tool_calls:
                raise invalid_request(
                    "an image goes in a user, system or assistant message's content, not in "
                    "a tool result or beside tool calls",
                    param="messages",
                )
        return "\n".join(texts)


def _with_tools_in_system_prompt(
    conversation: list[dict[str, Any]], tools_prompt: str
) -> list[dict[str, Any]]:
    if conversation and conversation[0]["role"] == "system":
        first = {**conversation[0], "content": f"{conversation[0]['content']}\n\n{tools_prompt}"}
        return [first, *conversation[1:]]
    return [{"role": "system", "content": tools_prompt}, *conversation]
