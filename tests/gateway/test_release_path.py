"""Releases on the gateway's request path, in process (`release_env`): the real app over
ASGI, a real SQLite file, and two canned upstreams on loopback sockets (the stable answers
"Hi!", the candidate "Yo!"), so each answer says which release gave it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import openai
import pytest
from canned_upstream import Canned
from release_env import CANDIDATE, STABLE, Env, run_gateway
from test_console_security import sign_in

from inhouse.gateway.releases.guardrail import Guardrail
from inhouse.gateway.releases.store import BackendRef, NewRelease


def test_a_canary_holds_each_key_on_one_release_and_every_record_names_it(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair

    async def test(env: Env) -> None:
        env.canary(candidate.url, 50)
        secrets = {f"k{i}": env.key(f"k{i}") for i in range(20)}
        seen: dict[str, set[str]] = {}
        for name, secret in secrets.items():
            answers = await asyncio.gather(*(env.ask(secret) for _ in range(4)))
            seen[name] = set(answers)
        assert all(len(replies) == 1 for replies in seen.values()), seen
        on_candidate = [n for n, replies in seen.items() if replies == {CANDIDATE}]
        assert 0 < len(on_candidate) < 20
        for name in secrets:
            release = 2 if name in on_candidate else 1
            assert {r["release"] for r in await env.rows(name)} == {release}
        env.log.truncate(0)
        await env.ask(secrets[on_candidate[0]])
        env.gateway.metrics.exposition()
        assert env.metric(
            "inhouse:gateway_release_requests_total",
            model_name="m", release="candidate", status_class="2xx",
        ) == 4 * len(on_candidate) + 1  # fmt: skip
        assert env.metric("inhouse:gateway_release_info", model_name="m", role="candidate",
                          number="2") == 1  # fmt: skip

    run_gateway(tmp_path, stable, test)


def test_the_access_log_names_the_release(tmp_path: Path, pair: tuple[Canned, Canned]) -> None:
    stable, candidate = pair

    async def test(env: Env) -> None:
        env.canary(candidate.url, 100)
        await env.ask(env.key("a"))
        await asyncio.sleep(0.7)  # the access log's batch
        assert "release=m@2" in env.log.getvalue()

    run_gateway(tmp_path, stable, test)


def test_promote_and_rollback_apply_from_the_next_request(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair

    async def test(env: Env) -> None:
        store = env.gateway.releases.store
        env.canary(candidate.url, 0)
        secret = env.key("a")
        assert await env.ask(secret) == STABLE
        store.promote("m", "test", None)
        assert await env.ask(secret) == CANDIDATE
        assert len(env.gateway.router.extra) == 1  # the candidate's URL, health-checked
        store.rollback("m", "test", "bad", to=1)
        assert await env.ask(secret) == STABLE
        assert env.gateway.router.extra == []  # no release names it now: no more checks

    run_gateway(tmp_path, stable, test)


def test_release_sampling_defaults_and_output_cap_reach_the_candidate(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair

    async def test(env: Env) -> None:
        new = NewRelease((BackendRef.parse(candidate.url, kind="vllm"),),
                         sampling={"temperature": 0.2}, max_output=7)  # fmt: skip
        first = NewRelease((BackendRef("stable"),))
        env.gateway.releases.store.canary("m", first, new, 100, 0, "test", None)
        await env.ask(env.key("a"), max_tokens=50, temperature=0.9)
        _, body = candidate.last()
        assert (body["temperature"], body["max_tokens"]) == (0.9, 7)  # the client's wins
        await env.ask(env.key("b"))
        _, body = candidate.last()
        assert (body["temperature"], body["max_tokens"]) == (0.2, 7)

    run_gateway(tmp_path, stable, test)


def test_a_slow_shadow_never_holds_the_answer_and_a_no_content_key_stores_no_text(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair
    candidate.delay_s = 1.0

    async def test(env: Env) -> None:
        env.canary(candidate.url, 0, shadow=100)
        plain, logged = env.key("plain"), env.key("logged", log_content=True)
        assert await env.ask_streamed(plain) == STABLE
        assert await env.ask(logged) == STABLE
        assert env.gateway.shadow.in_flight == 2 and await env.pairs() == []  # answered first
        while env.gateway.shadow.in_flight:
            await asyncio.sleep(0.05)
        rows = {r["key_name"]: r for r in await env.pairs()}
        assert rows["plain"]["primary_text"] is None and rows["plain"]["shadow_text"] is None
        assert rows["plain"]["exact_match"] is False  # compared in memory only
        assert rows["plain"]["shadow_ttft_ms"] >= 1000
        logged_row = rows["logged"]
        assert (logged_row["primary_text"], logged_row["shadow_text"]) == (STABLE, CANDIDATE)
        assert rows["logged"]["shadow_release"] == 2 and rows["logged"]["primary_release"] == 1
        audit = await env.rows("plain")
        assert audit[0]["completion_text"] is None and audit[0]["release"] == 1

    run_gateway(tmp_path, stable, test)


def test_shadow_copies_over_the_bound_are_dropped_and_counted(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair
    candidate.delay_s = 1.0

    async def test(env: Env) -> None:
        env.canary(candidate.url, 0, shadow=100)
        secret = env.key("a")
        answers = await asyncio.gather(*(env.ask(secret) for _ in range(6)))
        assert answers == [STABLE] * 6
        assert env.metric("inhouse:gateway_shadow_requests_total", model_name="m",
                          outcome="dropped") == 4  # fmt: skip
        assert env.metric("inhouse:gateway_shadow_requests_total", model_name="m",
                          outcome="sent") == 2  # fmt: skip

    run_gateway(tmp_path, stable, test, shadow_max_in_flight=2)


def test_a_down_candidate_changes_no_answer(tmp_path: Path, pair: tuple[Canned, Canned]) -> None:
    stable, _ = pair
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def test(env: Env) -> None:
        env.canary(dead, 100, shadow=0)
        secret = env.key("a")
        assert [await env.ask(secret) for _ in range(2)] == [STABLE] * 2  # stable answers
        assert {r["release"] for r in await env.rows("a")} == {1}
        env.gateway.releases.store.canary("m", NewRelease(()), None, 0, 100, "test", None)
        assert await env.ask(secret) == STABLE
        while env.gateway.shadow.in_flight:
            await asyncio.sleep(0.05)
        (pair_row,) = await env.pairs()
        assert (pair_row["primary_status"], pair_row["shadow_status"]) == (200, 502)

    run_gateway(tmp_path, stable, test, shadow_timeout_s=2.0)


def test_the_guardrail_rolls_a_failing_candidate_back(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair
    candidate.fail_status = 500

    async def test(env: Env) -> None:
        env.canary(candidate.url, 100, min_samples=5, max_error_rate=0.2)
        gateway = env.gateway
        guard = Guardrail(gateway.releases.store, gateway.release_metrics,
                          gateway.releases.candidates, 1.0)  # fmt: skip
        secret = env.key("a")
        for _ in range(4):
            with pytest.raises(openai.InternalServerError):
                await env.ask(secret)
        await gateway.audit.flush()
        assert guard.check_all() == []  # 4 samples: not enough to judge
        with pytest.raises(openai.InternalServerError):
            await env.ask(secret)
        await gateway.audit.flush()
        assert guard.check_all() == ["m"]
        event = gateway.releases.store.events("m", 1)[0]
        assert (event["action"], event["actor"], event["reason"]) == (
            "auto_rollback", "guardrail", "guardrail: error_rate")  # fmt: skip
        assert env.metric("inhouse:gateway_release_rollbacks_total", model_name="m",
                          reason="error_rate") == 1  # fmt: skip
        assert await env.ask(secret) == STABLE

    run_gateway(tmp_path, stable, test)


def test_a_stable_release_naming_unknown_backends_is_served_by_the_configured_ones(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair

    async def test(env: Env) -> None:
        renamed = NewRelease((BackendRef("renamed-since"),))
        new = NewRelease((BackendRef.parse(candidate.url, kind="vllm"),))
        env.gateway.releases.store.canary("m", renamed, new, 0, 0, "test", None)
        assert await env.ask(env.key("a")) == STABLE

    run_gateway(tmp_path, stable, test)


def test_the_guardrail_rolls_back_a_candidate_answering_invalid_json(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair
    stable.reply, candidate.reply = '{"ok": true}', "not json"
    schema = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}}}

    async def test(env: Env) -> None:
        env.canary(candidate.url, 100, min_samples=3, max_error_rate=0.2)
        gateway = env.gateway
        guard = Guardrail(gateway.releases.store, gateway.release_metrics,
                          gateway.releases.candidates, 1.0)  # fmt: skip
        secret = env.key("a")
        assert [await env.ask(secret, response_format=schema) for _ in range(3)] == [
            "not json"
        ] * 3  # answered 200: only the guardrail sees what is wrong
        await env.ask(secret)  # no json_schema: not checked
        await gateway.audit.flush()
        assert guard.check_all() == ["m"]
        assert gateway.releases.store.events("m", 1)[0]["reason"] == "guardrail: invalid_json"
        assert await env.ask(secret, response_format=schema) == '{"ok": true}'
        rows = await env.rows("a")
        assert [r["json_valid"] for r in rows] == [False, False, False, None, True]

    run_gateway(tmp_path, stable, test)


def test_the_console_health_page_shows_each_model_release(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair

    async def test(env: Env) -> None:
        await sign_in(env.http, env.key("ops", admin=True))
        assert "Release:" not in (await env.http.get("/admin/health")).text  # none yet
        env.canary(candidate.url, 25, shadow=10)
        page = (await env.http.get("/admin/health")).text
        assert "Release: stable 1 · candidate 2 on 25.0 % of keys, shadow 10.0 %" in page
        env.gateway.releases.store.promote("m", "test", None)
        page = (await env.http.get("/admin/health")).text
        assert "Release: stable 2 (" in page and "candidate" not in page

    run_gateway(tmp_path, stable, test)


def test_a_candidate_refusing_the_gateways_key_hands_its_requests_to_the_stable(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair
    candidate.fail_status = 401  # as vLLM answers a wrong or missing `--api-key-env` key

    async def test(env: Env) -> None:
        env.canary(candidate.url, 100)
        secret = env.key("a")
        assert await env.ask(secret) == STABLE
        assert await env.ask_streamed(secret) == STABLE
        assert [(r["release"], r["status"]) for r in await env.rows("a")] == [(1, 200)] * 2
        (backend,) = env.gateway.router.extra
        assert backend.failures == 2 and "refused the gateway's key" in (backend.last_error or "")
        stable.fail_status = 401  # the stable's key refused too: a 502, never the upstream's 401
        with pytest.raises(openai.InternalServerError) as refused:
            await env.ask(secret)
        assert refused.value.status_code == 502
        assert refused.value.code == "upstream_key_refused"
        assert "'stable' refused the gateway's key" in refused.value.message
        assert (await env.rows("a"))[-1]["status"] == 502

    run_gateway(tmp_path, stable, test)


def test_a_new_candidate_at_the_same_url_is_sent_with_its_own_model_and_key(
    tmp_path: Path, pair: tuple[Canned, Canned], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    stable, candidate = pair
    monkeypatch.setenv("CANDIDATE_KEY", "the-right-key")
    monkeypatch.delenv("UNSET_KEY", raising=False)

    async def test(env: Env) -> None:
        store = env.gateway.releases.store
        first = NewRelease((BackendRef("stable"),))
        wrong = BackendRef.parse(candidate.url, kind="vllm", model="old-name",
                                 api_key_env="UNSET_KEY")  # fmt: skip
        store.canary("m", first, NewRelease((wrong,)), 100, 0, "test", None)
        secret = env.key("a")
        assert await env.ask(secret) == CANDIDATE  # the canned upstream takes any key
        assert "$UNSET_KEY is not set in the gateway's environment" in caplog.text
        store.rollback("m", "test", "wrong model name")
        right = BackendRef.parse(candidate.url, kind="vllm", model="new-name",
                                 api_key_env="CANDIDATE_KEY")  # fmt: skip
        store.canary("m", None, NewRelease((right,)), 100, 0, "test", None)  # no request between
        assert await env.ask(secret) == CANDIDATE
        headers, body = candidate.last()
        assert body["model"] == "new-name"
        assert headers["authorization"] == "Bearer the-right-key"
        assert len(env.gateway.router.extra) == 1  # the old release's replica is forgotten

    run_gateway(tmp_path, stable, test)
