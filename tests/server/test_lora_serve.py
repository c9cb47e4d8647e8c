"""`inhouse serve --lora-modules`: adapters listed under their base, answered under their own
name, loaded and unloaded at run time with vLLM's endpoints, and every misuse answered with an
OpenAI-shaped error that leaves the server and its slots as they were."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from lora_adapters import bundled_adapter
from serving import SERVE_KEY, Served, start_serve

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: bundled_adapter(root / name, seed)
        for seed, name in enumerate(("support", "code", "legal", "extra"))
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("lora-serve") / "serve.log"
    modules = [f"{name}={adapters[name]}" for name in ("support", "code")]
    served = start_serve(log, lora_modules=modules, max_loras="3")
    try:
        yield served
    finally:
        served.stop()


def _client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=SERVE_KEY, max_retries=0)


def _post(served: Served, path: str, body: dict) -> httpx.Response:
    auth = {"Authorization": f"Bearer {SERVE_KEY}"}
    return httpx.post(f"{served.url}{path}", json=body, headers=auth, timeout=60)


def test_adapters_are_listed_under_their_base_and_answer_under_their_name(
    served: Served, adapters: dict[str, Path]
) -> None:
    client = _client(served)
    cards = {m.id: m.model_dump() for m in client.models.list()}
    base = served.model
    assert cards[base]["parent"] is None
    for name in ("support", "code"):
        assert cards[name]["parent"] == base and cards[name]["root"] == str(adapters[name])
    answers = {}
    for model in (base, "support", "code"):
        reply = client.chat.completions.create(model=model, messages=ASK, **GREEDY)
        assert reply.model == model
        answers[model] = reply.choices[0].message.content
    assert len(set(answers.values())) == 3, answers
    stream = client.chat.completions.create(model="support", messages=ASK, stream=True, **GREEDY)
    chunks = list(stream)
    assert {chunk.model for chunk in chunks} == {"support"}
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answers["support"]
    )
    legacy = client.completions.create(model="code", prompt="Colours:", **GREEDY)
    assert legacy.model == "code"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nobody", messages=ASK, **GREEDY)
    assert missing.value.code == "model_not_found"


def test_an_adapter_loaded_and_unloaded_at_run_time_and_each_misuse_refused(
    served: Served, adapters: dict[str, Path], tmp_path: Path
) -> None:
    client = _client(served)
    load = {"lora_name": "legal", "lora_path": str(adapters["legal"])}
    loaded = _post(served, "/v1/load_lora_adapter", load)
    assert loaded.status_code == 200 and "added successfully" in loaded.text
    assert client.chat.completions.create(model="legal", messages=ASK, **GREEDY).model == "legal"
    refusals = [
        (load, 400, "already loaded"),
        ({"lora_name": served.model, "lora_path": str(adapters["extra"])}, 400, "names a model"),
        ({"lora_name": "extra", "lora_path": str(tmp_path)}, 400, "is not a PEFT LoRA adapter"),
        ({"lora_name": "extra", "lora_path": str(adapters["extra"])}, 400, "all 3 adapter slots"),
        ({"lora_name": "has space", "lora_path": str(adapters["extra"])}, 400, "lora_name"),
        ({"lora_path": str(adapters["extra"])}, 400, "lora_name"),
    ]
    for body, status, words in refusals:
        answer = _post(served, "/v1/load_lora_adapter", body)
        assert answer.status_code == status, (body, answer.text)
        assert words in answer.json()["error"]["message"] + str(answer.json()["error"]["param"])
    unloaded = _post(served, "/v1/unload_lora_adapter", {"lora_name": "legal"})
    assert unloaded.status_code == 200 and "removed successfully" in unloaded.text
    again = _post(served, "/v1/unload_lora_adapter", {"lora_name": "legal"})
    assert again.status_code == 404 and again.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="legal", messages=ASK, **GREEDY)
    extra = _post(
        served, "/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": str(adapters["extra"])}
    )
    assert extra.status_code == 200, extra.text  # the freed slot is taken again
    assert _post(served, "/v1/unload_lora_adapter", {"lora_name": "extra"}).status_code == 200
    assert (
        client.chat.completions.create(model="support", messages=ASK, **GREEDY).model == "support"
    )
