"""The hand-written half of the hostile suite: bodies and headers a hostile or careless
client sends to each POST route (see `benchmarks/hostile_suite.py`). Each attack is sent
as raw bytes, so lone surrogates, absurd numbers and broken UTF-8 arrive as written."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, replace
from typing import Any

from inhouse.api import bounds

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
TOKENIZE, DETOKENIZE = "/tokenize", "/detokenize"
POSTS = (CHAT, COMPLETIONS, EMBEDDINGS, TOKENIZE, DETOKENIZE)
HI = [{"role": "user", "content": "Say hi."}]
OUTPUT = 4  # tokens a valid generating attack may make
SURROGATE = "\ud800"  # json.dumps writes it as the escape \ud800: valid JSON, invalid text


@dataclass(frozen=True)
class Attack:
    """One request: its name, route and raw body; `auth` replaces the target's own
    Authorization header (a list: several, or none). `heavy`: a large tokenization or
    embedding (issue 24 items 4 and 5), sent alone so a slow /health names its cause."""

    name: str
    path: str
    body: bytes | None
    method: str = "POST"
    auth: tuple[str, ...] | None = None
    content_type: str = "application/json"
    heavy: bool = False


def _raw(value: Any) -> bytes:
    return json.dumps(value).encode()


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def _not_objects() -> list[Attack]:
    raws = [b"null", b"0", b"-1.5e3", b"true", b'"text"', b"[]", b'[{"model": "x"}]', b"1e999"]
    broken = {
        "empty body": b"",
        "truncated": b'{"model": ',
        "trailing garbage": b'{"model": "x"} x',
        "NaN": b'{"model": "x", "temperature": NaN}',
        "invalid UTF-8": b'{"model": "\xff\xfe"}',
        "UTF-8 surrogate bytes": b'{"model": "\xed\xa0\x80"}',
        "BOM": b'\xef\xbb\xbf{"model": "x"}',
        "UTF-16": '{"model": "x"}'.encode("utf-16"),
        "duplicate keys": b'{"model": "x", "model": 5}',
        "deep 100000": _nested(100_000).encode(),
    }
    attacks = [Attack(f"top-level {raw[:12]!r}", path, raw) for path in POSTS for raw in raws]
    attacks += [Attack(name, path, raw) for path in POSTS for name, raw in broken.items()]
    return attacks


# Values of one wrong kind each, tried on the fields where a number, a string, a list or an
# object belongs.
NUMBERS = ["5", 5.5, True, -1, 0, 2**31, 2**63, 2**64, -(2**63) - 1, None, [1], {"a": 1}]
STRINGS = [5, None, [], {}, True, "", SURROGATE, "x" * 1_000_000]


PNG_1X1 = (  # a 1 × 1 PNG, base64
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def _png_uri(width: int, height: int) -> str:
    """A black 1-bit PNG of that size as a data URI (a 9000 x 9000 one is a few kB)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


IMAGE_PARTS: dict[str, Any] = {  # seed 004's image 400s and the SSRF door
    "type image": {"type": "image", "image": f"data:image/png;base64,{PNG_1X1}"},
    "type input_image": {"type": "input_image", "image_url": "x"},
    "url not base64": {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}},
    "url text/plain": {"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}},
    "url metadata": {"type": "image_url", "image_url": {"url": "http://169.254.169.254/"}},
    "url file": {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
    "url [::1": {"type": "image_url", "image_url": {"url": "https://[::1"}},
    "url surrogate": {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + SURROGATE},
    },
    "url 12 MB": {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + "A" * 12_000_000},
    },
    "5 pngs": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1X1}"}}] * 5,
    "png 9000 x 9000": {"type": "image_url", "image_url": {"url": _png_uri(9000, 9000)}},
    "png truncated": {"type": "image_url", "image_url": {"url": _png_uri(64, 64)[:200]}},
    "png 1 x 4000": {"type": "image_url", "image_url": {"url": _png_uri(1, 4000)}},
    "a stray image token": [
        {"type": "text", "text": "<image><fake_token_around_image><global-img>"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1X1}"}},
    ],
}


def _image_message(parts: Any) -> list[dict[str, Any]]:
    content = [
        {"type": "text", "text": "What is this?"},
        *(parts if isinstance(parts, list) else [parts]),
    ]
    return [{"role": "user", "content": content}]


def _chat(model: str) -> list[Attack]:
    def body(**fields: Any) -> dict[str, Any]:
        return {"model": model, "messages": HI, "max_tokens": OUTPUT, **fields}

    fields: list[tuple[str, dict[str, Any]]] = []
    for name in ("max_tokens", "max_completion_tokens", "n", "top_k", "seed", "logprobs"):
        fields += [(f"{name}={value!r:.20}", {name: value}) for value in NUMBERS]
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "repetition_penalty"):
        fields += [(f"{name}={v!r}", {name: v}) for v in (-1, 1e308, "hot", None, [0.5])]
    fields += [(f"model={v!r:.20}", {"model": v}) for v in STRINGS]
    fields += [
        (f"messages {what}", {"messages": value})
        for what, value in {
            "string": "hi",
            "object": {"role": "user"},
            "empty": [],
            "[1]": [1],
            "no content": [{"role": "user"}],
            "content 1": [{"role": "user", "content": 1}],
            "alien role": [{"role": "alien", "content": "x"}],
            "role surrogate": [{"role": SURROGATE, "content": "x"}],
            "content surrogate": [{"role": "user", "content": "a" + SURROGATE}],
            "key surrogate": [{"role": "user", "content": "x", SURROGATE: 1}],
            "junk part": [{"role": "user", "content": [{"type": "junk"}]}],
            "image junk": [{"role": "user", "content": [{"type": "image_url", "image_url": 5}]}],
            **{f"image {what}": _image_message(part) for what, part in IMAGE_PARTS.items()},
            "10^5 messages": [{"role": "user", "content": "a"}] * 100_000,
            "1 MiB content": [{"role": "user", "content": "hello " * 175_000}],
            "deep content": json.loads(f'[{{"role": "user", "content": {_nested(70)}}}]'),
            "tool call junk": [{"role": "assistant", "tool_calls": [{"id": 1}]}],
        }.items()
    ]
    fields += [
        ("stop 17", {"stop": ["a"] * 17}),
        (
            "stop 16 x 256",
            {"stop": [chr(97 + i) * bounds.MAX_STOP_STRING_CHARS for i in range(16)]},
        ),
        ("stop empty", {"stop": ""}),
        ("stop 257 chars", {"stop": "x" * (bounds.MAX_STOP_STRING_CHARS + 1)}),
        ("stop 1 MiB", {"stop": "x" * 2**20}),
        ("stop [1]", {"stop": [1]}),
        ("stop surrogate", {"stop": [SURROGATE]}),
        ("stop_token_ids -1", {"stop_token_ids": [-1]}),
        ("stop_token_ids 2**31", {"stop_token_ids": [2**31]}),
        ("stop_token_ids 1025", {"stop_token_ids": [1] * 1025}),
        ("stop_token_ids past vocab", {"stop_token_ids": [2**31 - 1], "min_tokens": 2}),
        ("min_tokens > max", {"min_tokens": 100, "max_tokens": 2}),
        ("logit_bias word key", {"logit_bias": {"x": 1}}),
        ("logit_bias 2**40", {"logit_bias": {str(2**40): 1}}),
        ("logit_bias 1000", {"logit_bias": {"1": 1000}}),
        ("logit_bias 1025", {"logit_bias": {str(i): 1 for i in range(1025)}}),
        ("logit_bias past vocab", {"logit_bias": {str(2**31 - 1): 5}}),
        ("top_logprobs 21", {"logprobs": True, "top_logprobs": 21}),
        ("stream 'false'", {"stream": "false"}),
        ("stream_options yes", {"stream": True, "stream_options": "yes"}),
        ("stream_options junk", {"stream": True, "stream_options": {"include_usage": "yes"}}),
        ("ignore_eos 'yes'", {"ignore_eos": "yes"}),
        ("user 1 MiB", {"user": "u" * 2**20}),
        ("n 16 valid", {"n": 16, "max_tokens": 2}),
    ]
    schema_junk: list[Any] = [
        "json",
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": 5},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "(("}}},
        {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": json.loads(
                    '{"type": "object", "properties": {"a": ' * 60
                    + '{"type": "string"}'
                    + "}}" * 60
                ),
            },
        },
        {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {
                    "type": "object",
                    "properties": {f"p{i}": {"type": "integer"} for i in range(2000)},
                },
            },
        },
        {"type": "json_schema", "json_schema": {"name": SURROGATE, "schema": {}}},
        {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 2**40}},
        },
        {"type": "json_object", "extra": 1},
        {"type": "regex"},
        {"type": "text", "json_schema": []},
    ]
    fields += [(f"response_format #{i}", {"response_format": v}) for i, v in enumerate(schema_junk)]
    function = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    tools_junk: list[Any] = [
        5,
        [5],
        [{}],
        [{"type": "function"}],
        [{"type": "function", "function": {"name": 5}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/x"}}}],
        [{"type": "function", "function": {"name": "f" * 100_000}}],
        [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": json.loads(
                        '{"type": "object", "properties": {"a": ' * 60
                        + '{"type": "string"}'
                        + "}}" * 60
                    ),
                },
            }
        ],
        [function] * 500,
        [{"type": "function", "function": {"name": SURROGATE}}],
    ]
    fields += [
        (f"tools #{i}", {"tools": v, "tool_choice": "required"}) for i, v in enumerate(tools_junk)
    ]
    fields += [
        (f"tool_choice {v!r:.30}", {"tools": [function], "tool_choice": v})
        for v in (
            "always",
            5,
            {"type": "function"},
            {"type": "function", "function": {"name": "g"}},
        )
    ]
    fields += [
        (f"chat_template_kwargs {name}", {"chat_template_kwargs": {name: value}})
        for name, value in {
            "add_generation_prompt": False,
            "messages": [],
            "conversation": [],
            "tools": [],
            "tokenize": True,
            "return_dict": True,
            "chat_template": "{{ raise }}",
            "continue_final_message": True,
            "documents": 5,
            SURROGATE: 1,
        }.items()
    ]
    fields += [("chat_template_kwargs 5", {"chat_template_kwargs": 5})]
    fields += [("chat_template junk", {"chat_template": "{% for %}"})]
    return [Attack(f"chat {name}", CHAT, _raw(body(**extra))) for name, extra in fields]


def _completions(model: str) -> list[Attack]:
    prompts: dict[str, Any] = {
        "missing": ...,
        "null": None,
        "5": 5,
        "empty": "",
        "[]": [],
        "[[]]": [[]],
        "[[-1]]": [[-1]],
        "[[2**40]]": [[2**40]],
        "[[2**31-1]]": [[2**31 - 1]],
        "mixed": ["a", [1]],
        "257 strings": ["hi"] * (bounds.MAX_COMPLETION_PROMPTS + 1),
        "256 token lists": [[5]] * bounds.MAX_COMPLETION_PROMPTS,
        "257 token lists": [[5]] * (bounds.MAX_COMPLETION_PROMPTS + 1),
        "3000 words": "hi " * 3000,
        "2040 token ids": [5] * 2040,
        "10^5 token ids": [5] * 100_000,
        "surrogate": "a" + SURROGATE,
        "[1.5]": [1.5],
        "[true]": [True],
        "deep": json.loads(_nested(70, '"a"')),
    }
    body = {"model": model, "max_tokens": OUTPUT}
    attacks = [
        Attack(f"completions prompt {name}", COMPLETIONS,
               _raw(body if value is ... else {**body, "prompt": value}))
        for name, value in prompts.items()
    ]  # fmt: skip
    extras: dict[str, dict[str, Any]] = {
        "echo 'yes'": {"echo": "yes"},
        "best_of 2**63": {"best_of": 2**63},
        "suffix 5": {"suffix": 5},
        "logprobs 21": {"logprobs": 21},
        "n 16 x 16 prompts": {"prompt": ["hi"] * 16, "n": 16, "max_tokens": 1},
        "max_tokens past context": {"max_tokens": 5000},
        "max_tokens null": {"max_tokens": None, "max_completion_tokens": None},
        "stop 1 MiB": {"stop": "x" * 2**20},
        "seed + n past 2**64": {"seed": 2**64 - 2, "n": 4},
        "logit_bias past vocab": {"logit_bias": {str(2**31 - 1): 5}},
    }
    attacks += [
        Attack(f"completions {name}", COMPLETIONS, _raw({**body, "prompt": "hi", **extra}))
        for name, extra in extras.items()
    ]
    return attacks


def _embeddings(model: str) -> list[Attack]:
    inputs: dict[str, Any] = {
        "missing": ...,
        "null": None,
        "5": 5,
        "object": {"a": 1},
        "[]": [],
        "[[]]": [[]],
        "['']": [""],
        "2049": ["a"] * 2049,
        "[[2**40]]": [[2**40]],
        "[[-1]]": [[-1]],
        "mixed": ["a", [1]],
        "surrogate": SURROGATE,
        "[surrogate]": ["a", SURROGATE],
        "1 MiB string": "hello " * 175_000,
        "64 x 200 words": ["hello world " * 100] * 64,
        "2048 short": ["a"] * 2048,
        "deep": json.loads(_nested(70, '"a"')),
    }
    attacks = [
        Attack(f"embeddings input {name}", EMBEDDINGS,
               _raw({"model": model} if value is ... else {"model": model, "input": value}))
        for name, value in inputs.items()
    ]  # fmt: skip
    extras: dict[str, dict[str, Any]] = {
        "dimensions 0": {"dimensions": 0},
        "dimensions 65537": {"dimensions": 65537},
        "dimensions '3'": {"dimensions": "3"},
        "dimensions 2**63": {"dimensions": 2**63},
        "encoding_format hex": {"encoding_format": "hex"},
        "encoding_format 5": {"encoding_format": 5},
        "user 5": {"user": 5},
    }
    attacks += [
        Attack(f"embeddings {name}", EMBEDDINGS, _raw({"model": model, "input": "x", **extra}))
        for name, extra in extras.items()
    ]
    attacks += [
        Attack(f"embeddings model={v!r:.20}", EMBEDDINGS, _raw({"model": v, "input": "x"}))
        for v in STRINGS
    ]
    return attacks


def _tokenize(model: str) -> list[Attack]:
    bodies: dict[str, Any] = {
        "prompt 5": {"prompt": 5},
        "prompt null": {"prompt": None},
        "prompt surrogate": {"prompt": SURROGATE},
        "prompt 1 MiB": {"prompt": "hello " * 175_000},
        "prompt and messages": {"prompt": "a", "messages": HI},
        "messages junk": {"messages": [{"role": 5}]},
        "messages 10^4": {"messages": [{"role": "user", "content": "a"}] * 10_000},
        "add_special_tokens 'yes'": {"prompt": "a", "add_special_tokens": "yes"},
        "chat_template_kwargs collision": {"messages": HI,
                                           "chat_template_kwargs": {"messages": []}},
        "nothing": {},
    }  # fmt: skip
    attacks = [
        Attack(f"tokenize {name}", TOKENIZE, _raw({"model": model, **body}))
        for name, body in bodies.items()
    ]
    tokens: dict[str, Any] = {
        "[-1]": [-1],
        "[2**40]": [2**40],
        "[2**31-1]": [2**31 - 1],
        "'abc'": "abc",
        "[1.5]": [1.5],
        "null": None,
        "10^5": [5] * 100_000,
        "[[1]]": [[1]],
    }
    attacks += [
        Attack(f"detokenize tokens {name}", DETOKENIZE, _raw({"model": model, "tokens": value}))
        for name, value in tokens.items()
    ]
    attacks += [
        Attack(f"{path} model={v!r:.20}", path, _raw({"model": v, "prompt": "a", "tokens": [1]}))
        for path in (TOKENIZE, DETOKENIZE)
        for v in STRINGS
    ]
    return attacks


def _requests(chat_model: str, key: str) -> list[Attack]:
    """Headers, methods and paths: what reaches routing and authentication."""
    hi = _raw({"model": chat_model, "messages": HI, "max_tokens": OUTPUT})
    auths: dict[str, tuple[str, ...]] = {
        "no Authorization": (),
        "two Authorization, same": (f"Bearer {key}", f"Bearer {key}"),
        "two Authorization, one wrong": (f"Bearer {key}", "Bearer wrong"),
        "two Authorization, wrong first": ("Bearer wrong", f"Bearer {key}"),
        "Bearer only": ("Bearer",),
        "Basic": ("Basic dXNlcjpwYXNz",),
        "10 KB key": ("Bearer " + "k" * 10_000,),
        "two spaces after Bearer": (f"Bearer  {key}",),
        "lower-case bearer": (f"bearer {key}",),
    }
    attacks = [Attack(f"auth: {name}", CHAT, hi, auth=auth) for name, auth in auths.items()]
    attacks += [
        Attack("content-type text/plain", CHAT, hi, content_type="text/plain"),
        Attack("content-type form", CHAT, b"model=x&messages=y",
               content_type="application/x-www-form-urlencoded"),
        Attack("body over the cap (9 MiB)", CHAT, b'{"model": "' + b"x" * (9 * 2**20) + b'"}'),
    ]  # fmt: skip
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        attacks += [Attack(f"{method} {path}", path, None, method=method) for path in POSTS]
    for path in ("/v2/chat", "/v1/chat/completions/", "/v1/../health", "/%ff", "/v1/models/x"):
        attacks.append(Attack(f"GET {path}", path, None, method="GET"))
    return attacks


HEAVY = (
    "10^5 messages", "1 MiB content", "1 MiB string", "64 x 200 words", "2048 short",
    "prompt 1 MiB", "messages 10^4", "3000 words", "10^5 token ids",
)  # fmt: skip


def hostile_attacks(chat_model: str, embedding_model: str, key: str) -> list[Attack]:
    """Every hand-written attack on one server, in a fixed order."""
    attacks = [
        *_not_objects(),
        *_chat(chat_model),
        *_completions(chat_model),
        *_embeddings(embedding_model),
        *_tokenize(chat_model),
        *_requests(chat_model, key),
    ]
    return [replace(a, heavy=a.name.endswith(HEAVY)) for a in attacks]
