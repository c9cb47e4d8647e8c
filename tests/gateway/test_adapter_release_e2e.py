"""Releasing a new version of a LoRA adapter end to end: two random adapters built here
(`support` and `support-v2`, `lora_adapters`) pinned in a manifest with the bundled model
(`inhouse models lock --lora-modules`), a real `inhouse serve --manifest` serving both, a real
`inhouse gateway` with a SQLite file, the `inhouse release` CLI and the official client.

One test runs the phases on one stack: a 10 % canary of `support-v2` under the name `support`
lands on about 10 % of many keys, each key always on its side (by the answer itself and by the
audit rows); shadow pairs and the live figures compare the two adapters; a rollback returns
every key to the old version."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from inhouse.gateway.releases.canary import on_candidate
from inhouse.gateway.releases.store import ReleaseStore
from inhouse.launch.inhouse import inhouse_command
from inhouse.manifests.bundled import default_chat_model
from lora_adapters import bundled_adapter
from serving import (
    adapter_gateway_toml,
    audit_rows,
    free_port,
    gateway_process,
    release_cli,
    start_serve,
)

pytestmark = pytest.mark.slow

KEYS = 60
ROUNDS = 2  # requests per key while the canary runs
ASK = [{"role": "user", "content": "Name three colours."}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 6}


@dataclass
class Stack:
    base: Path
    config: Path
    url: str
    db_url: str
    manifest: Path
    secrets: dict[str, str]  # by key name
    ids: dict[str, int]  # by key name

    def release(self, *args: str) -> str:
        return release_cli(self.config, *args)

    def answer(self, secret: str, model: str = "support") -> str:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=secret, max_retries=0)
        answer = client.chat.completions.create(model=model, messages=ASK, **GREEDY)
        return answer.choices[0].message.content or ""

    def answers(self, names: list[str]) -> list[str]:
        """Each key's answer for `support`, four at a time (in one batch upstream)."""
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda n: self.answer(self.secrets[n]), names))


def _lock(base: Path, adapters: dict[str, Path]) -> Path:
    """`inhouse models lock` of the bundled model with the adapters pinned."""
    manifest = base / "inhouse.model.toml"
    modules = [a for name, path in adapters.items() for a in ("--lora-modules", f"{name}={path}")]
    done = subprocess.run(
        [*inhouse_command(), "models", "lock", str(default_chat_model()), "--out", str(manifest),
         *modules], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return manifest


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("adapter-release")
    adapters = {name: bundled_adapter(base / name, seed)
                for seed, name in enumerate(("support", "support-v2"))}  # fmt: skip
    manifest = _lock(base, adapters)
    served = start_serve(base / "serve.log", manifest=str(manifest), max_loras="2")
    try:
        port, db_url = free_port(), f"sqlite:///{base / 'gateway.db'}"
        text = adapter_gateway_toml(port, db_url, served, ["support", "support-v2"])
        config = base / "inhouse.toml"
        gateway = gateway_process(config, text)
        gateway.start()
        try:
            url = f"http://127.0.0.1:{port}"
            gateway.wait_healthy(f"{url}/health", 60)
            store = KeyStore(open_database(db_url), load_pepper(load_config(config)))
            names = [f"person-{i:02d}" for i in range(KEYS)]
            keys = {name: store.create(name, adapters=frozenset({"support"})) for name in names}
            keys["ops"] = store.create("ops")
            secrets = {name: secret for name, (_, secret) in keys.items()}
            ids = {name: key.id for name, (key, _) in keys.items()}
            yield Stack(base, config, url, db_url, manifest, secrets, ids)
        finally:
            gateway.stop()
    finally:
        served.stop()


def _sides(stack: Stack, names: list[str], old: str, new: str) -> dict[str, set[str]]:
    """Which version answered each key, over ROUNDS requests each, by the answer's text."""
    sides: dict[str, set[str]] = {name: set() for name in names}
    for _ in range(ROUNDS):
        for name, text in zip(names, stack.answers(names), strict=True):
            assert text in (old, new), text
            sides[name].add("new" if text == new else "old")
    return sides


def _a_10_percent_canary_is_sticky_per_key(stack: Stack, old: str, new: str) -> set[str]:
    out = stack.release(
        "canary", "support", "--backend", "serve", "--adapter", "support-v2",
        "--manifest", str(stack.manifest), "--percent", "10", "--by", "e2e",
    )  # fmt: skip
    assert "support: stable release 1, candidate release 2 at 10% of keys" in out
    names = [n for n in stack.secrets if n != "ops"]
    sides = _sides(stack, names, old, new)
    assert all(len(side) == 1 for side in sides.values()), sides  # each key on one side
    on_new = {name for name, side in sides.items() if side == {"new"}}
    store = ReleaseStore(open_database(stack.db_url))
    candidate = store.releases("support")[2]
    assert candidate.adapter == "support-v2" and candidate.manifest is not None
    pinned = candidate.manifest["adapters"]  # the release names the adapter by its digest
    assert set(pinned) == {"support", "support-v2"}
    assert all(p["revision"].startswith("sha256:") for p in pinned.values())
    expected = {n for n in names if on_candidate(stack.ids[n], candidate.id, 10)}
    assert on_new == expected
    assert 2 <= len(on_new) <= 14, len(on_new)  # ~10 % of 60 keys (binomial, 99.9 %)
    for name in names:  # the audit rows say which version answered
        rows = audit_rows(stack.db_url, name, ROUNDS)
        assert [(r["model"], r["adapter"]) for r in rows] == [("smol", "support")] * ROUNDS
        assert {r["release"] for r in rows} == ({2} if name in on_new else {1})
    return on_new


def _shadow_pairs_and_live_figures_compare_the_two_adapters(
    stack: Stack, old: str, new: str, on_new: set[str]
) -> None:
    stack.release("canary", "support", "--percent", "10", "--shadow", "100", "--by", "e2e")
    stable_keys = [n for n in stack.secrets if n not in on_new and n != "ops"][:8]
    for name in stable_keys:  # one at a time: no copy is dropped over the bound
        assert stack.answer(stack.secrets[name]) == old
    report: dict[str, Any] = {}
    for _ in range(60):  # the pairs are stored in batches
        report = json.loads(stack.release("compare", "support", "--png",
                                          str(stack.base / "compare.png"), "--json"))  # fmt: skip
        if report["shadow"]["pairs"] >= len(stable_keys):
            break
    assert (report["model"], report["stable"], report["candidate"]) == ("support", 1, 2)
    shadow = report["shadow"]
    assert shadow["pairs"] == len(stable_keys)
    assert shadow["agreement"]["n"] == len(stable_keys)
    assert shadow["agreement"]["value"] == 0.0  # support-v2 answered the copies, not support
    live = report["live"]
    assert live["candidate"]["requests"] == ROUNDS * len(on_new)
    assert live["stable"]["requests"] == ROUNDS * (KEYS - len(on_new)) + len(stable_keys)
    assert live["candidate"]["errors"]["k"] == live["stable"]["errors"]["k"] == 0
    text = stack.release("compare", "support", "--png", str(stack.base / "compare.png"))
    assert "support: candidate release 2 vs stable 1" in text
    status = json.loads(stack.release("status", "support", "--json"))
    assert [r["adapter"] for r in status["releases"]] == [None, "support-v2"]


def _a_rollback_returns_every_key_to_the_old_version(
    stack: Stack, old: str, on_new: set[str]
) -> None:
    out = stack.release("rollback", "support", "--by", "e2e", "--reason", "v2 answers worse")
    assert "support: stable release 1 ·" in out
    names = [n for n in stack.secrets if n != "ops"]
    assert stack.answers(names) == [old] * len(names)
    for name in on_new:
        assert audit_rows(stack.db_url, name, ROUNDS + 1)[-1]["release"] == 1
    base = stack.answer(stack.secrets["ops"], "smol")  # the base model has no releases
    assert base not in (old, "") and json.loads(stack.release("status", "smol", "--json"))[
        "state"] is None  # fmt: skip


def test_a_10_percent_canary_of_a_new_adapter_version_is_sticky_per_key_and_rolls_back(
    stack: Stack,
) -> None:
    """One test, since each phase starts from the state the one before left and the suite
    shuffles test functions (pytest-randomly)."""
    old = stack.answer(stack.secrets["ops"], "support")
    new = stack.answer(stack.secrets["ops"], "support-v2")
    assert old != new  # the two versions tell themselves apart by their answers
    on_new = _a_10_percent_canary_is_sticky_per_key(stack, old, new)
    _shadow_pairs_and_live_figures_compare_the_two_adapters(stack, old, new, on_new)
    _a_rollback_returns_every_key_to_the_old_version(stack, old, on_new)
