"""`inhouse release compare` on what the gateway recorded (`release_env`: the real app, a real
SQLite file, two canned upstreams on loopback): a candidate that refuses plain questions,
answers `json_schema` requests with JSON its schema rejects and calls tools with arguments
the tool's parameters reject, first shadowed, then live at 100 %; the report's refusals,
JSON-schema and tool-call validity on both sides, paired with exact McNemar, in JSON, text
and a PNG, and the stored answers graded with an eval set."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from canned_upstream import Canned
from release_env import HELLO, STABLE, Env, run_gateway
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.gateway.releases.store import NewRelease

REFUSAL = "I'm sorry, but I can't help with that."
OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "ok", "schema": OK_SCHEMA}}
JSON_ASK = [{"role": "user", "content": "Is it ok? Answer in JSON."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_ASK = [{"role": "user", "content": "Weather in Paris?"}]
EACH = 3  # requests of each kind per key


def _candidate_gone_wrong(stable: Canned, candidate: Canned) -> None:
    stable.json_reply, stable.tool_call = '{"ok": true}', ("get_weather", '{"city": "Paris"}')
    candidate.reply, candidate.json_reply = REFUSAL, '{"ok": "yes"}'  # JSON, not the schema's
    candidate.tool_call = ("get_weather", '{"city": 5}')  # JSON, not the tool's parameters


async def _traffic(env: Env, secret: str) -> list[str]:
    """EACH plain, json_schema and tool requests, streamed and not; the answers' texts."""
    answers = []
    for i in range(EACH):
        ask = env.ask_streamed if i % 2 else env.ask
        answers.append(await ask(secret))
        answers.append(await ask(secret, JSON_ASK, response_format=JSON_FORMAT))
        answers.append(await ask(secret, TOOL_ASK, tools=[WEATHER]))
    return answers


def _compare(env: Env, png: Path, *extra: str) -> tuple[int, str]:
    args = ["release", "compare", "m", "--database", env.db_url, "--png", str(png), *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def _eval_set(path: Path) -> Path:
    items: list[dict[str, Any]] = [
        {"id": "hello", "messages": HELLO, "grader": "refusal", "expected": False},
        {"id": "ok-json", "messages": JSON_ASK, "grader": "json_schema", "expected": OK_SCHEMA,
         "response_format": JSON_FORMAT},
        {"id": "weather", "messages": TOOL_ASK, "grader": "tool_call", "tools": [WEATHER],
         "expected": {"name": "get_weather"}},
        {"id": "never-asked", "prompt": "Nobody sent this", "grader": "contains",
         "expected": "x"},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def test_compare_reports_refusals_and_json_and_tool_call_validity(
    tmp_path: Path, pair: tuple[Canned, Canned]
) -> None:
    stable, candidate = pair
    _candidate_gone_wrong(stable, candidate)

    async def test(env: Env) -> None:
        env.canary(candidate.url, 0, shadow=100)
        logged, plain = env.key("logged", log_content=True), env.key("plain")
        for secret in (logged, plain):
            assert (await _traffic(env, secret))[:3] == [STABLE, '{"ok": true}', ""]
        while env.gateway.shadow.in_flight:
            await asyncio.sleep(0.05)
        rows = await env.pairs()
        assert len(rows) == 2 * 3 * EACH
        for row in rows:  # the bits of a no-content key, and no text
            assert row["prompt_hash"] is not None and row["exact_match"] is False
            if row["key_name"] == "plain":
                assert row["primary_text"] is None and row["shadow_text"] is None
        plain_rows = [r for r in rows if r["key_name"] == "plain"]
        assert sum(r["shadow_refusal"] for r in plain_rows) == EACH
        assert [r["shadow_json_valid"] for r in plain_rows].count(False) == EACH
        assert [r["shadow_tool_calls_valid"] for r in plain_rows].count(False) == EACH
        assert [r["primary_tool_calls_valid"] for r in plain_rows].count(True) == EACH

        code, out = _compare(env, tmp_path / "shadow.png", "--json")
        assert code == 0, out
        shadow = json.loads(out)["shadow"]
        pairs = 2 * EACH  # of each kind
        refusals = shadow["refusals"]  # every answer is checked: 3 kinds
        assert (refusals["primary"]["k"], refusals["shadow"]["k"]) == (0, pairs)
        assert refusals["primary"]["n"] == refusals["paired"]["n"] == 3 * pairs
        assert (refusals["paired"]["a_only"], refusals["paired"]["b_only"]) == (0, pairs)
        assert refusals["paired"]["p_value"] == 2 / 2**pairs
        assert refusals["paired"]["low"] > 0  # the candidate refuses more, and it shows
        for check in ("json_valid", "tool_calls_valid"):
            figures = shadow[check]
            assert (figures["primary"]["value"], figures["shadow"]["value"]) == (1.0, 0.0)
            assert figures["paired"]["n"] == pairs and figures["paired"]["diff"] == -1.0
            assert figures["paired"]["p_value"] == 2 / 2**pairs
        assert shadow["agreement"]["k"] == 0

        env.gateway.releases.store.canary("m", NewRelease(()), None, 100, 0, "test", None)
        assert await env.ask(plain) == REFUSAL  # live now: the candidate answers everyone
        await _traffic(env, plain)
        await env.gateway.audit.flush()
        png = tmp_path / "compare.png"
        code, out = _compare(env, png, "--json", "--grade", str(_eval_set(tmp_path / "set.jsonl")))
        assert code == 0, out
        report = json.loads(out)
        live_stable, live_candidate = report["live"]["stable"], report["live"]["candidate"]
        assert live_stable["refusals"]["k"] == 0 and live_stable["json_valid"]["value"] == 1.0
        assert live_candidate["refusals"]["k"] == 1 + EACH
        assert live_candidate["json_valid"] == {**live_candidate["json_valid"], "k": 0, "n": EACH}
        assert live_candidate["tool_calls_valid"]["n"] == EACH
        assert live_candidate["tool_calls_valid"]["k"] == 0
        graded = report["graded"]  # the logged key's pairs: hello and ok-json, both lost
        assert (graded["pairs"], graded["matched_items"], graded["tool_call_pairs"]) == (
            2 * EACH, 2, EACH)  # fmt: skip
        assert (graded["stable"]["value"], graded["candidate"]["value"]) == (1.0, 0.0)
        assert graded["paired"]["a_only"] == 2 * EACH and graded["right_to_wrong"] == [
            "hello", "ok-json"]  # fmt: skip
        assert png.stat().st_size > 20_000

        code, text = _compare(env, png, "--grade", str(tmp_path / "set.jsonl"))
        assert code == 0
        assert f"refusals: stable 0.0% [0.0%, 17.6%] of {3 * pairs}" in text
        assert f"{pairs} candidate only), exact McNemar p = 0.0312" in text
        assert "valid tool calls (answers that call a tool): stable 100.0%" in text
        assert "graded with the eval set: 6 pairs of 2 of its 4 items" in text
        assert "right to wrong: hello, ok-json" in text

    run_gateway(tmp_path, stable, test)


def test_compare_refuses_an_eval_set_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    args = ["release", "compare", "m", "--database", database, "--grade"]
    for path in (tmp_path / "bad.jsonl", tmp_path / "missing.jsonl"):
        result = CliRunner().invoke(app, [*args, str(path)])
        assert result.exit_code == 1 and "--grade:" in result.output
        assert "Traceback" not in result.output
