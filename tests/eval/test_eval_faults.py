"""`inhouse eval` against a small upstream of our own on a real loopback port that answers
429 (with Retry-After), 503, 500 and wrong answers: retried or counted, the report still
written, and a second run resumes, asking again only what failed."""

from __future__ import annotations

import email.utils
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.eval.client import retry_after
from inhouse.launch.ports import free_port

RETRY_AFTER_S = 0.3
# question -> (right answer, what the "flaky" model does first, "steady" model's answer)
QUESTIONS = {
    "2+2": "4",
    "busy 3+3": "6",  # flaky: 429 with Retry-After once
    "overloaded 5+5": "10",  # flaky: 503 without Retry-After once
    "broken 1+1": "2",  # flaky: always 500
    "wrong 7+1": "8",  # flaky answers 9
    "regressed 9+9": "18",  # steady answers 17
}


@dataclass
class Upstream:
    """An OpenAI-shaped chat endpoint with scripted failures; records when each question came."""

    url: str = ""
    seen: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        model, question = body["model"], body["messages"][-1]["content"]
        times = self.seen[model, question]
        times.append(time.monotonic())
        answer = QUESTIONS[question]
        if model == "flaky":
            if question.startswith("busy") and len(times) == 1:
                return _error(429, "slow down", {"Retry-After": str(RETRY_AFTER_S)})
            if question.startswith("overloaded") and len(times) == 1:
                return _error(503, "overloaded")
            if question.startswith("broken"):
                return _error(500, "boom")
            if question.startswith("wrong"):
                answer = "9"
        if model == "steady" and question.startswith("regressed"):
            answer = "17"
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        )

    def count(self, model: str) -> int:
        return sum(len(v) for (m, _), v in self.seen.items() if m == model)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    """A fresh scripted upstream for each test: its script counts what it was asked."""
    state = Upstream()
    routes = [Route("/v1/chat/completions", state.chat, methods=["POST"])]
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the scripted upstream did not start"
    state.url = f"http://127.0.0.1:{port}"
    yield state
    server.should_exit = True
    thread.join(timeout=10)


def _eval_set(tmp_path: Path) -> Path:
    path = tmp_path / "set.jsonl"
    lines = [
        {
            "id": f"q{i}",
            "messages": [{"role": "user", "content": q}],
            "expected": float(a),
            "grader": "numeric",
            "tags": ["scripted", "odd" if i % 2 else "even"],
        }
        for i, (q, a) in enumerate(QUESTIONS.items())
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _run(upstream: Upstream, eval_set: Path, out: Path) -> dict:
    # the old spelling, kept as an alias of --base-url
    args = ["eval", str(eval_set), "--url", upstream.url, "--model", "flaky", "--api-key", "k"]
    args += ["--vs-url", upstream.url, "--vs-model", "steady", "--out", str(out)]
    args += ["--retries", "2", "--concurrency", "3", "--name", "old", "--vs-name", "new"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "McNemar" in result.output
    return json.loads((out / "report.json").read_text())


def test_failures_are_retried_or_counted_and_the_report_is_written(
    upstream: Upstream, tmp_path: Path
) -> None:
    report = _run(upstream, _eval_set(tmp_path), tmp_path / "out")
    old, new = report["endpoints"]
    assert (old["name"], new["name"]) == ("old", "new")
    assert old["errors"] == 1 and new["errors"] == 0
    assert old["accuracy"]["correct"] == 4 and new["accuracy"]["correct"] == 5
    assert old["by_tag"]["scripted"]["n"] == 6
    per_item = {row["id"]: row for row in report["per_item"]}
    assert per_item["q1"]["old"]["attempts"] == 2 and per_item["q1"]["old"]["correct"]
    assert per_item["q2"]["old"]["attempts"] == 2 and per_item["q2"]["old"]["correct"]
    assert per_item["q3"]["old"]["error"] == "HTTP 500: boom"
    assert per_item["q3"]["old"]["attempts"] == 1  # a 500 is counted, not retried
    assert per_item["q0"]["new"]["completion_tokens"] == 1
    first, second = upstream.seen["flaky", "busy 3+3"]
    assert second - first >= RETRY_AFTER_S * 0.9  # Retry-After honoured
    comparison = report["comparison"]
    assert comparison["right_to_wrong"] == ["q5"]
    assert comparison["wrong_to_right"] == ["q3", "q4"]
    assert comparison["paired_difference"]["diff"] == pytest.approx(1 / 6)
    assert comparison["mcnemar_exact_p"] == pytest.approx(1.0)  # 1 vs 2: 2*(1+3)/8
    assert (tmp_path / "out" / "accuracy_by_tag.png").read_bytes()[:4] == b"\x89PNG"


def test_a_second_run_resumes_and_asks_only_what_failed(upstream: Upstream, tmp_path: Path) -> None:
    eval_set, out = _eval_set(tmp_path), tmp_path / "out"
    _run(upstream, eval_set, out)
    flaky, steady = upstream.count("flaky"), upstream.count("steady")
    broken_before = len(upstream.seen["flaky", "broken 1+1"])
    report = _run(upstream, eval_set, out)
    assert upstream.count("steady") == steady  # every answer reused
    assert upstream.count("flaky") == flaky + 1  # only the 500 asked again
    assert len(upstream.seen["flaky", "broken 1+1"]) == broken_before + 1
    assert report["endpoints"][0]["errors"] == 1


def test_retry_after_reads_seconds_and_http_dates_and_is_capped() -> None:
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after(httpx.Headers({"Retry-After": "2.5"}), 0.5, 60) == 2.5
    assert 28 <= retry_after(httpx.Headers({"Retry-After": soon}), 0.5, 60) <= 30
    assert retry_after(httpx.Headers({"Retry-After": "3600"}), 0.5, 60) == 60
    assert retry_after(httpx.Headers({"Retry-After": "soon"}), 0.5, 60) == 0.5
    assert retry_after(httpx.Headers(), 4.0, 60) == 4.0
