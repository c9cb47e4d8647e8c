"""Prompts shaped like real traffic: random token lengths, JSONL of real prompts, shared
prefix, and random prompts with generated images (vLLM bench's random-mm)."""

from __future__ import annotations

import base64
import json
import random
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from inhouse.bench.requests import BenchRequest, Endpoint

# Common English words: almost every BPE vocabulary holds each of them, with its leading
# space, as a single token, so word counts start close to token counts.
_WORD_TEXT = """
    time year people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question work
    government number night point home water room mother area money story fact month lot right
    study book eye job word business issue side kind head house service friend father power
    hour game line end member law car city community name president team minute idea kid body
    information back parent face others level office door health person art war history party
    result change morning reason research girl guy moment air teacher force education foot boy
    age policy music market sense nation plan college interest death experience effect class
    control care field development role effort rate heart drug show leader light voice wife
    police mind price report decision son view relationship town road arm difference value
    building action model season society tax director position player record paper space
    ground form event official matter center couple site project activity star table need court
    oil situation cost industry figure street image phone data picture practice piece land
    product doctor wall patient worker news test movie north love support technology step baby
    computer type attention film tree source organization hair window evidence population site
    river garden bridge summer winter letter answer"""
WORDS = tuple(_WORD_TEXT.split())


class TokenCounter(Protocol):
    """Counts tokens the way the server's tokenizer does."""

    async def count(self, text: str) -> int:
        """Number of tokens `text` becomes."""
        ...


@dataclass(slots=True, frozen=True)
class LengthSpec:
    """Token lengths drawn uniformly from mean·(1 − spread) … mean·(1 + spread)."""

    mean: int
    spread: float = 0.0

    def draw(self, rng: random.Random) -> int:
        """One length, at least 1 token."""
        low = round(self.mean * (1 - self.spread))
        high = round(self.mean * (1 + self.spread))
        return max(1, rng.randint(low, high))


def random_words(rng: random.Random, count: int) -> list[str]:
    """`count` words drawn from the pool."""
    return [rng.choice(WORDS) for _ in range(count)]


async def text_of_tokens(
    rng: random.Random, target: int, counter: TokenCounter | None, max_rounds: int = 6
) -> str:
    """Random words that the server's tokenizer turns into `target` tokens (±1 when it cannot).

    Without a counter the word count stands in for the token count (one word ≈ one token).
    """
    words = random_words(rng, target)
    if counter is None:
        return " ".join(words)
    for _ in range(max_rounds):
        tokens = await counter.count(" ".join(words))
        if tokens == target:
            break
        if tokens > target:
            drop = max(1, (tokens - target) * len(words) // tokens)
            if drop >= len(words):
                break
            del words[-drop:]
        else:
            words.extend(random_words(rng, max(1, (target - tokens) * len(words) // tokens)))
    return " ".join(words)


def _as_request(
    index: int, text: str, endpoint: Endpoint, max_tokens: int, intended: int | None
) -> BenchRequest:
    if endpoint == "chat":
        return BenchRequest(
            index=index,
            max_tokens=max_tokens,
            messages=({"role": "user", "content": text},),
            intended_input_tokens=intended,
        )
    return BenchRequest(
        index=index, max_tokens=max_tokens, prompt=text, intended_input_tokens=intended
    )


async def random_dataset(
    num_prompts: int,
    input_len: LengthSpec,
    output_len: LengthSpec,
    *,
    seed: int,
    endpoint: Endpoint = "chat",
    counter: TokenCounter | None = None,
    template_overhead: int = 0,
) -> list[BenchRequest]:
    """Prompts of random words whose token lengths follow `input_len`, checked with `counter`.

    `template_overhead` is what the chat template adds around the user's text; it is taken off
    each target so the whole prompt, as the server sees it, has the intended length.
    """
    rng = random.Random(seed)
    requests = []
    for index in range(num_prompts):
        intended = input_len.draw(rng)
        text_tokens = max(1, intended - template_overhead)
        text = await text_of_tokens(rng, text_tokens, counter)
        requests.append(_as_request(index, text, endpoint, output_len.draw(rng), intended))
    return requests


IMAGE_BLOCK = 8  # pixels a side of one random colour: distinct images that still compress


def png_image(width: int, height: int, rng: random.Random) -> bytes:
    """A PNG of random 8 × 8 colour blocks: every call's image differs, so no server cache
    answers one twice, and it stays small enough to send by the hundred."""
    blocks = -(-width // IMAGE_BLOCK)
    rows = []
    for _ in range(-(-height // IMAGE_BLOCK)):
        colours = [rng.randbytes(3) * IMAGE_BLOCK for _ in range(blocks)]
        rows += [b"\x00" + b"".join(colours)[: 3 * width]] * IMAGE_BLOCK
    pixels = b"".join(rows[:height])

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(pixels))
        + chunk(b"IEND", b"")
    )


def image_part(width: int, height: int, rng: random.Random) -> dict[str, object]:
    """An `image_url` content part holding a new PNG as a data URI."""
    encoded = base64.b64encode(png_image(width, height, rng)).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}}


def with_images(
    requests: list[BenchRequest], images: int, size: tuple[int, int], seed: int
) -> list[BenchRequest]:
    """Chat requests with `images` new images of `size` after each one's text; their token
    count is the server's to tell (`usage`), so no intended length is kept."""
    rng = random.Random(seed + 1)
    shaped = []
    for request in requests:
        assert request.messages is not None
        text = {"type": "text", "text": request.messages[-1]["content"]}
        content = [text, *(image_part(*size, rng) for _ in range(images))]
        message = {**request.messages[-1], "content": content}
        messages = (*request.messages[:-1], message)
        shaped.append(replace(request, messages=messages, intended_input_tokens=None))
    return shaped


async def shared_prefix_dataset(
    num_prompts: int,
    num_questions: int,
    prefix_len: int,
    question_len: LengthSpec,
    output_len: LengthSpec,
    *,
    seed: int,
    endpoint: Endpoint = "chat",
    counter: TokenCounter | None = None,
    num_prefixes: int = 1,
) -> list[BenchRequest]:
    """`num_questions` distinct questions behind each of `num_prefixes` long system prompts
    (vLLM's prefix-repetition dataset: documents each asked several questions).

    Requests share a prefix's first `prefix_len` tokens, which is what prefix caching saves;
    the questions differ so the tail of every prompt is computed afresh. One prefix: its
    questions in turn; several: every (prefix, question) pair once in a shuffled order, then
    again, so a replica that computed a document is not the obvious next one to ask.
    """
    rng = random.Random(seed)
    system = await text_of_tokens(rng, prefix_len, counter)
    questions = [
        await text_of_tokens(rng, question_len.draw(rng), counter) for _ in range(num_questions)
    ]
    documents = [system] + [
        await text_of_tokens(rng, prefix_len, counter) for _ in range(num_prefixes - 1)
    ]
    pairs = [(document, question) for document in documents for question in questions]
    if num_prefixes > 1:
        rng.shuffle(pairs)
    requests = []
    for index in range(num_prompts):
        document, question = pairs[index % len(pairs)]
        max_tokens = output_len.draw(rng)
        if endpoint == "chat":
            messages = (
                {"role": "system", "content": document},
                {"role": "user", "content": question},
            )
            requests.append(BenchRequest(index=index, max_tokens=max_tokens, messages=messages))
        else:
            prompt = f"{document}\n\n{question}"
            requests.append(BenchRequest(index=index, max_tokens=max_tokens, prompt=prompt))
    return requests


class DatasetError(ValueError):
    """A dataset file that cannot be read as prompts."""


def _jsonl_request(index: int, line_no: int, item: object, default_max_tokens: int) -> BenchRequest:
    if not isinstance(item, dict):
        raise DatasetError(f"line {line_no}: expected a JSON object")
    max_tokens = item.get("max_tokens", item.get("max_completion_tokens", default_max_tokens))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise DatasetError(f"line {line_no}: max_tokens must be a positive integer")
    if "messages" in item:
        messages = item["messages"]
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise DatasetError(f"line {line_no}: messages must be a list of {{role, content}}")
        return BenchRequest(index=index, max_tokens=max_tokens, messages=tuple(messages))
    if isinstance(item.get("prompt"), str):
        return BenchRequest(index=index, max_tokens=max_tokens, prompt=item["prompt"])
    raise DatasetError(f'line {line_no}: needs "messages" (chat) or "prompt" (completion)')


def read_jsonl(path: Path, default_max_tokens: int) -> list[BenchRequest]:
    """Real prompts, one JSON object a line: `{"messages": [...]}` or `{"prompt": "..."}`.

    A line may carry its own `max_tokens`; otherwise `default_max_tokens` applies.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from exc
    requests: list[BenchRequest] = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path} line {line_no}: not JSON ({exc.msg})") from exc
        requests.append(_jsonl_request(len(requests), line_no, item, default_max_tokens))
    if not requests:
        raise DatasetError(f"{path} holds no prompts")
    return requests
