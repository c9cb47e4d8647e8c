"""LoRA adapters through a real gateway process before the canned upstream, which serves any
model name and loads and unloads adapters in vLLM's shapes (`canned_upstream`), with a real
SQLite file and the official client: an adapter is routed under its own name, refused with
403 to a key or team limited to others and 404 where no backend serves it, listed with its
base, counted and costed by adapter, and loaded and unloaded by admin keys only.
(`test_adapters_serve_e2e` runs the same path against `inhouse serve --lora-modules`.)"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from canned_upstream import Canned, canned_upstream
from gateway_under_test import Gateway, key_rows, start_gateway
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.gateway.db_open import open_database
from inhouse.gateway.usage.teams import TeamStore
from serving import free_port, gateway_key, gateway_process, gateway_toml

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hello"}]
ADAPTERS = ("support", "code")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, canned: Canned) -> Iterator[Gateway]:
    running = start_gateway(tmp_path_factory.mktemp("gateway"), canned, adapters=ADAPTERS)
    try:
        yield running
    finally:
        running.process.stop()


def refused(call: object, error: type[openai.APIStatusError]) -> openai.APIStatusError:
    """The error the client raised for `call` (a zero-argument callable)."""
    with pytest.raises(error) as caught:
        call()  # type: ignore[operator]
    return caught.value


def test_an_adapter_is_sent_upstream_under_its_name_and_audited_with_its_base(
    gateway: Gateway, canned: Canned
) -> None:
    client = gateway.client(gateway.key("plain"))
    answer = client.chat.completions.create(model="support", messages=HELLO)
    assert answer.choices[0].message.content and canned.last()[1]["model"] == "support"
    client.chat.completions.create(model="m", messages=HELLO)
    assert canned.last()[1]["model"] == "up-model"
    rows = key_rows(gateway, "plain", 2)
    assert [(r["model"], r["adapter"], r["status"]) for r in rows] == [
        ("m", "support", 200), ("m", None, 200)
    ]  # fmt: skip


def test_an_adapters_requests_go_only_to_the_replicas_serving_it(
    tmp_path: Path, upstreams: tuple[Canned, Canned]
) -> None:
    serving, other = upstreams
    backends = [
        {"name": name, "url": canned.url, "model": "base-up", "kind": "vllm", **extra}
        for name, canned, extra in (("with", serving, {"adapters": ["support"]}),
                                    ("without", other, {}))
    ]  # fmt: skip
    port, config = free_port(), tmp_path / "inhouse.toml"
    text = gateway_toml(
        {"port": port, "database": f"sqlite:///{tmp_path / 'gateway.db'}"},
        [{"name": "duo", "routing": "least-loaded", "backends": backends}],
    )
    process = gateway_process(config, text)
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        process.wait_healthy(f"{url}/health", 60)
        secret = gateway_key(config, "both")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)
        for model in ["support"] * 4 + ["duo"] * 4:
            client.chat.completions.create(model=model, messages=HELLO)
    finally:
        process.stop()

    def asked(canned: Canned) -> list[str]:  # the models of this test's chats (not probes)
        return [b["model"] for _, b in canned.received if b.get("messages") == HELLO]

    assert asked(serving).count("support") == 4 and "support" not in asked(other)
    assert "base-up" in asked(other)  # the base's requests go to both


def test_a_key_limited_to_an_adapter_gets_403_for_another(gateway: Gateway) -> None:
    client = gateway.client(gateway.key("support-only", adapters=frozenset({"support"})))
    assert client.chat.completions.create(model="support", messages=HELLO).usage
    assert client.chat.completions.create(model="m", messages=HELLO).usage  # its base: --models'
    error = refused(
        lambda: client.chat.completions.create(model="code", messages=HELLO),
        openai.PermissionDeniedError,
    )
    assert error.status_code == 403 and error.code == "adapter_not_allowed"
    assert "'code'" in error.message and "this key" in error.message
    streamed = refused(
        lambda: client.chat.completions.create(model="code", messages=HELLO, stream=True),
        openai.PermissionDeniedError,
    )
    assert streamed.code == "adapter_not_allowed"
    rows = key_rows(gateway, "support-only", 4)
    assert [(r["adapter"], r["status"]) for r in rows[2:]] == [("code", 403), ("code", 403)]


def test_an_adapter_no_backend_serves_or_on_a_base_the_key_may_not_use_is_404(
    gateway: Gateway,
) -> None:
    client = gateway.client(gateway.key("anyone"))
    error = refused(
        lambda: client.chat.completions.create(model="nobody-serves-this", messages=HELLO),
        openai.NotFoundError,
    )
    assert error.code == "model_not_found"
    other_base = gateway.client(gateway.key("slow-only", models=frozenset({"slow"})))
    hidden = refused(
        lambda: other_base.chat.completions.create(model="support", messages=HELLO),
        openai.NotFoundError,
    )
    assert hidden.code == "model_not_found"


def test_a_teams_adapters_limit_its_keys_until_the_team_is_updated(gateway: Gateway) -> None:
    TeamStore(open_database(gateway.db_url)).create("helpdesk", adapters=frozenset({"support"}))
    client = gateway.client(gateway.key("desk-1", team="helpdesk"))
    assert client.chat.completions.create(model="support", messages=HELLO).usage
    error = refused(
        lambda: client.chat.completions.create(model="code", messages=HELLO),
        openai.PermissionDeniedError,
    )
    assert error.code == "adapter_not_allowed" and "'helpdesk'" in error.message
    runner = CliRunner()
    update = ["teams", "update", "helpdesk", "--adapters", "all", "--database", gateway.db_url]
    assert runner.invoke(app, update).exit_code == 0
    assert client.chat.completions.create(model="code", messages=HELLO).usage  # the next request


def test_v1_models_lists_the_adapters_a_key_may_use_with_their_base(gateway: Gateway) -> None:
    def listed(secret: str) -> dict[str, str | None]:
        return {m.id: getattr(m, "parent", None) for m in gateway.client(secret).models.list()}

    everything = listed(gateway.key("lister"))
    assert everything == {"m": None, "slow": None, "code": "m", "support": "m"}
    assert listed(gateway.key("lister-2", adapters=frozenset({"code"}))) == {
        "m": None, "slow": None, "code": "m"
    }  # fmt: skip
    assert listed(gateway.key("lister-3", models=frozenset({"slow"}))) == {"slow": None}


def test_usage_and_cost_by_adapter_equal_the_clients_counts(tmp_path: Path, canned: Canned) -> None:
    own = start_gateway(tmp_path / "usage", canned, adapters=ADAPTERS)  # its own audit
    try:
        client = own.client(own.key("counted"))
        counts: dict[str, list[int]] = {}
        for model in ("support", "support", "code", "m"):
            usage = client.chat.completions.create(model=model, messages=HELLO).usage
            assert usage is not None
            into = counts.setdefault(model if model in ADAPTERS else "-", [0, 0, 0])
            into[0] += 1
            into[1] += usage.prompt_tokens
            into[2] += usage.completion_tokens
        stream = client.chat.completions.create(
            model="code", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        last = [chunk for chunk in stream][-1].usage
        assert last is not None
        counts["code"] = [counts["code"][0] + 1, counts["code"][1] + last.prompt_tokens,
                          counts["code"][2] + last.completion_tokens]  # fmt: skip
        key_rows(own, "counted", 5)
    finally:
        own.process.stop()
    config = tmp_path / "cost.toml"
    config.write_text(gateway_toml(
        {"database": own.db_url}, [{"name": "m", "backends": [{"url": canned.url}]}],
        cost={"currency": "EUR", "charge": {"input_per_million": 1e5, "output_per_million": 4e5}},
    ))  # fmt: skip
    result = CliRunner().invoke(
        app, ["usage", "--by", "adapter", "--json", "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    rows = {r["group"]: r for r in json.loads(result.stdout)["rows"]}
    assert {g: [r["requests"], r["prompt_tokens"], r["completion_tokens"]]
            for g, r in rows.items()} == counts  # fmt: skip
    for group, (_, prompt, completion) in counts.items():
        assert rows[group]["cost"] == pytest.approx(0.1 * prompt + 0.4 * completion)


def test_only_an_admin_key_loads_and_unloads_an_adapter(
    gateway: Gateway, canned: Canned, tmp_path: Path
) -> None:
    folder = tmp_path / "billing-adapter"
    folder.mkdir()
    load = {"lora_name": "billing", "lora_path": str(folder), "model": "m"}
    plain = gateway.key("not-an-admin")
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        denied = gateway.post(path, plain, load)
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "not_admin"
        assert httpx.post(f"{gateway.url}{path}", json=load).status_code == 401
    assert "billing" not in canned.adapters
    client = gateway.client(plain)
    refused(lambda: client.chat.completions.create(model="billing", messages=HELLO),
            openai.NotFoundError)  # fmt: skip

    admin = gateway.key("ops", admin=True)
    loaded = gateway.post("/v1/load_lora_adapter", admin, load)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["model"] == "m" and loaded.json()["backends"][0]["status"] == 200
    assert "billing" in canned.adapters
    client.chat.completions.create(model="billing", messages=HELLO)
    assert canned.last()[1]["model"] == "billing"
    assert "billing" in {m.id for m in client.models.list()}
    again = gateway.post("/v1/load_lora_adapter", admin, load)
    assert again.status_code == 400 and again.json()["error"]["code"] == "adapter_loaded"

    unloaded = gateway.post("/v1/unload_lora_adapter", admin, {"lora_name": "billing"})
    assert unloaded.status_code == 200, unloaded.text
    assert "billing" not in canned.adapters
    refused(lambda: client.chat.completions.create(model="billing", messages=HELLO),
            openai.NotFoundError)  # fmt: skip
    gone = gateway.post("/v1/unload_lora_adapter", admin, {"lora_name": "billing"})
    assert gone.status_code == 404


def test_a_load_the_backend_refuses_passes_its_status_and_routes_nothing(
    gateway: Gateway,
) -> None:
    admin = gateway.key("ops-2", admin=True)
    body = {"lora_name": "broken", "lora_path": "/nonexistent/adapter", "model": "m"}
    failed = gateway.post("/v1/load_lora_adapter", admin, body)
    assert failed.status_code == 404, failed.text
    detail = "Loading lora broken failed: No adapter found"
    assert failed.json()["backends"] == [{"backend": "canned-m", "status": 404, "detail": detail}]
    wrong_base = gateway.post("/v1/load_lora_adapter", admin, {**body, "model": "nope"})
    assert wrong_base.status_code == 404
    no_base = {k: v for k, v in body.items() if k != "model"}  # two models: which one?
    assert gateway.post("/v1/load_lora_adapter", admin, no_base).status_code == 400
    taken = gateway.post("/v1/load_lora_adapter", admin, {**body, "lora_name": "m"})
    assert taken.status_code == 400
    moved = gateway.post("/v1/load_lora_adapter", admin,
                         {"lora_name": "support", "lora_path": "/x", "model": "slow"})  # fmt: skip
    assert moved.status_code == 409 and moved.json()["error"]["code"] == "adapter_conflict"
    client = gateway.client(gateway.key("after-broken"))
    refused(lambda: client.chat.completions.create(model="broken", messages=HELLO),
            openai.NotFoundError)  # fmt: skip


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until `check()` holds (a few health intervals of 1 s at most)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.2)


def test_a_replica_that_lists_its_adapters_is_routed_what_it_lists(tmp_path: Path) -> None:
    with canned_upstream() as canned:
        canned.lists_models, canned.adapters = True, {"listed"}
        own = start_gateway(tmp_path / "listing", canned, adapters=("declared",))
        try:
            client = own.client(own.key("reader"))

            def routed() -> set[str]:
                return {m.id for m in client.models.list()} - {"m", "slow"}

            eventually(lambda: routed() == {"listed"})
            client.chat.completions.create(model="listed", messages=HELLO)
            assert canned.last()[1]["model"] == "listed"
            refused(lambda: client.chat.completions.create(model="declared", messages=HELLO),
                    openai.NotFoundError)  # fmt: skip
            canned.adapters.add("elsewhere")  # loaded through another gateway replica
            eventually(lambda: routed() == {"listed", "elsewhere"})
            canned.adapters.clear()  # the replica restarted without them
            eventually(lambda: routed() == set())
        finally:
            own.process.stop()
