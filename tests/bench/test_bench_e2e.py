"""`inhouse bench` against a real `inhouse serve` on loopback: metrics, sweep, failures, input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from typer.testing import CliRunner

from inhouse.bench.schema import RESULTS_SCHEMA
from inhouse.bench.sweep import find_knee
from inhouse.cli import app
from serving import SERVE_KEY as API_KEY
from serving import Served, free_port

pytest.importorskip("inhouse.server")
pytestmark = pytest.mark.slow


def bench(*args: str) -> Any:
    """Run `inhouse bench …` in process; returns click's result (stdout, stderr, exit code)."""
    return CliRunner().invoke(app, ["bench", *args], catch_exceptions=False)


def endpoint(served: Served) -> list[str]:
    return ["--base-url", served.url, "--model", served.model, "--api-key", API_KEY]


def load(out: Path) -> dict[str, Any]:
    document = json.loads((out / "results.json").read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    return document


def test_short_run_yields_every_metric_with_sane_relations(served: Served, tmp_path: Path) -> None:
    result = bench(
        "run",
        *endpoint(served),
        "--max-concurrency",
        "2",
        "--num-prompts",
        "6",
        "--input-len",
        "64",
        "--output-len",
        "12",
        "--ignore-eos",
        "--slo",
        "ttft=60s",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    assert "TTFT" in result.stdout and "TPOT" in result.stdout and "goodput" in result.stdout
    document = load(tmp_path)
    run = document["runs"][0]
    summary, records = run["summary"], run["requests"]
    assert summary["completed"] == 6 and summary["failed"] == 0 and len(records) == 6
    for name in ("ttft", "tpot", "itl", "e2e"):
        dist = summary[name]
        assert dist["count"] > 0, name
        assert 0 < dist["p50"] <= dist["p90"] <= dist["p95"] <= dist["p99"] <= dist["max"], name
    for record in records:
        assert record["ok"] and record["token_source"] == "usage"
        assert 0 < record["ttft"] <= record["e2e"]
        assert record["output_tokens"] == 12  # ignore_eos: exactly max_tokens, from usage
        assert record["tpot"] == pytest.approx((record["e2e"] - record["ttft"]) / 11)
        assert abs(record["prompt_tokens"] - record["intended_input_tokens"]) <= 2  # /tokenize
    assert summary["total_output_tokens"] == 72
    assert summary["total_input_tokens"] == sum(r["prompt_tokens"] for r in records)
    assert summary["goodput"] == pytest.approx(6 / summary["duration"])
    assert run["server_metrics"]["samples"] > 0
    assert run["server_metrics"]["kv_cache_usage_peak"] is not None
    assert "api_key" not in document["config"] and API_KEY not in json.dumps(document)


def test_usage_matches_the_official_client_on_the_same_prompt(
    served: Served, tmp_path: Path
) -> None:
    prompt = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 20}
    dataset = tmp_path / "one.jsonl"
    dataset.write_text(json.dumps(prompt) + "\n")
    result = bench(
        "run",
        *endpoint(served),
        "--dataset",
        "jsonl",
        "--dataset-path",
        str(dataset),
        "--max-concurrency",
        "1",
        "--num-prompts",
        "1",
        "--warmup",
        "0",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    record = load(tmp_path)["runs"][0]["requests"][0]
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0)
    answer = client.chat.completions.create(model=served.model, temperature=0, **prompt)
    assert record["prompt_tokens"] == answer.usage.prompt_tokens
    assert record["output_tokens"] == answer.usage.completion_tokens
    assert record["finish_reason"] == answer.choices[0].finish_reason


def _calibrate(served: Served, tmp_path: Path) -> float:
    """An SLO halfway between one request's TTFT and its E2E when it runs alone.

    The server runs two sequences at a time, so with 4 in flight the other two wait about a
    whole answer for a slot: their TTFT passes this SLO however fast or loaded the machine is.
    """
    out = tmp_path / "alone"
    result = bench(
        "run",
        *endpoint(served),
        "--max-concurrency",
        "1",
        "--num-prompts",
        "2",
        "--input-len",
        "32",
        "--output-len",
        "24",
        "--ignore-eos",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    summary = load(out)["runs"][0]["summary"]
    return (summary["ttft"]["max"] + summary["e2e"]["p50"]) / 2


def test_sweep_names_the_knee_beside_the_plan_and_draws_both_plots(
    served: Served, tmp_path: Path
) -> None:
    slo = _calibrate(served, tmp_path)
    # A real plan whose KV budget buys about five sequences of this benchmark's size; the
    # server's --max-num-seqs 2 makes the real knee lower: the mismatch a bench is for.
    planned = CliRunner().invoke(
        app, ["plan", "--vram", "1GiB", "--overhead", "823MiB", "--avg-context", "56", "--json"]
    )
    assert planned.exit_code == 0, planned.output
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(planned.stdout)
    predicted = json.loads(planned.stdout)["memory"]["max_concurrent_sequences"]
    out = tmp_path / "sweep"
    result = bench(
        "sweep",
        *endpoint(served),
        "--steps",
        "1,2,4",
        "--plan",
        str(plan_file),
        "--input-len",
        "32",
        # long enough that the first of c=4's two waves outlasts the 0.5 s between scrapes
        # of /metrics, so one of them sees the queue (24 tokens took ~0.4 s on 2 cores)
        "--output-len",
        "96",
        "--ignore-eos",
        "--prompts-per-slot",
        "1",
        "--min-prompts",
        "2",
        "--slo",
        f"ttft={slo:.3f}s",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    document = load(out)
    verdict = document["sweep"]
    steps = [(run["max_concurrency"], run["summary"]["ttft"]["p99"]) for run in document["runs"]]
    assert [c for c, _ in steps] == [1, 2, 4]
    assert all(run["summary"]["failed"] == 0 for run in document["runs"])
    assert verdict["knee"] in (2, 4)
    assert verdict["knee"] == find_knee(steps, float(f"{slo:.3f}"))
    assert verdict["predicted_max_concurrency"] == predicted
    assert verdict["knee_over_predicted"] == pytest.approx(verdict["knee"] / predicted)
    assert f"knee is at concurrency {verdict['knee']}" in " ".join(result.stdout.split())
    top = document["runs"][-1]["server_metrics"]
    assert top["waiting_peak"] >= 1 and top["running_peak"] <= 2
    for name in ("latency_vs_concurrency.png", "throughput_vs_concurrency.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 20_000


def test_400s_are_counted_and_the_run_still_reports(served: Served, tmp_path: Path) -> None:
    dataset = tmp_path / "mixed.jsonl"
    lines = [{"prompt": "Hello there", "max_tokens": 4}] * 3
    lines.append({"prompt": "word " * 2000, "max_tokens": 4})  # longer than --max-model-len 512
    dataset.write_text("\n".join(json.dumps(line) for line in lines))
    result = bench(
        "run",
        *endpoint(served),
        "--dataset",
        "jsonl",
        "--dataset-path",
        str(dataset),
        "--max-concurrency",
        "2",
        "--num-prompts",
        "4",
        "--warmup",
        "0",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    summary = load(tmp_path)["runs"][0]["summary"]
    assert summary["completed"] == 3 and summary["failures"] == {"http_400": 1}
    assert "http_400: 1" in result.stdout


def test_timeouts_are_counted_and_the_run_still_reports(served: Served, tmp_path: Path) -> None:
    result = bench(
        "run",
        *endpoint(served),
        "--max-concurrency",
        "2",
        "--num-prompts",
        "2",
        "--warmup",
        "0",
        "--input-len",
        "32",
        "--output-len",
        "300",
        "--ignore-eos",
        "--timeout",
        "0.3",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    run = load(tmp_path)["runs"][0]
    assert run["summary"]["failures"] == {"timeout": 2} and run["summary"]["completed"] == 0
    assert all(r["e2e"] == pytest.approx(0.3, abs=0.25) for r in run["requests"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("url", "cannot reach http://127.0.0.1:"),
        ("key", "rejected the API key (HTTP 401"),
        ("model", "model 'no-such-model' is not served"),
    ],
)
def test_bad_input_gets_one_clear_message_before_the_run(
    served: Served, tmp_path: Path, change: str, message: str
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1" if change == "url" else f"{served.url}/v1"
    key = "wrong-key" if change == "key" else API_KEY
    model = "no-such-model" if change == "model" else served.model
    result = bench(
        "run",
        "--base-url",
        url,
        "--model",
        model,
        "--api-key",
        key,
        "--max-concurrency",
        "1",
        "--num-prompts",
        "1",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not (tmp_path / "results.json").exists()
    if change == "model":
        assert served.model in result.stderr


def test_a_kept_alive_connection_the_server_dropped_is_replaced(served: Served) -> None:
    import asyncio
    import time

    from inhouse.bench.client import StreamingClient
    from inhouse.bench.requests import BenchRequest

    request = BenchRequest(index=0, max_tokens=2, prompt="Hello")

    async def twice() -> list[bool]:
        async with StreamingClient(served.url, served.model, api_key=API_KEY) as client:
            first = await client.send(request, time.perf_counter())
            await asyncio.sleep(6)  # past uvicorn's 5 s keep-alive: the server closes it
            second = await client.send(request, time.perf_counter())
        return [first.ok, second.ok]

    assert asyncio.run(twice()) == [True, True]


def test_open_loop_arrivals_follow_the_seed_and_stop_at_the_duration(
    served: Served, tmp_path: Path
) -> None:
    import random

    from inhouse.bench.loadgen import arrival_gaps

    result = bench(
        "run",
        *endpoint(served),
        "--request-rate",
        "4",
        "--duration",
        "2",
        "--seed",
        "11",
        "--warmup",
        "0",
        "--input-len",
        "16",
        "--output-len",
        "2",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    requests = sorted(load(tmp_path)["runs"][0]["requests"], key=lambda r: r["index"])
    draw = arrival_gaps(4.0, 1.0, random.Random(11))
    expected, at = [], 0.0
    while at < 2.0:
        expected.append(at)
        at += draw()
    assert len(requests) == len(expected)
    for request, planned in zip(requests, expected, strict=True):
        assert request["ok"] and request["start"] == pytest.approx(planned, abs=0.15)


def test_shared_prefix_shows_the_prefix_cache_at_work(served: Served, tmp_path: Path) -> None:
    result = bench(
        "run",
        *endpoint(served),
        "--dataset",
        "shared-prefix",
        "--prefix-len",
        "240",
        "--num-questions",
        "3",
        "--input-len",
        "12",
        "--output-len",
        "2",
        "--max-concurrency",
        "1",
        "--num-prompts",
        "6",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    run = load(tmp_path)["runs"][0]
    assert run["summary"]["completed"] == 6
    prompts = [r["prompt_tokens"] for r in run["requests"]]
    assert min(prompts) > 240
    # Every request after the warm-up finds the 240-token system prompt's full blocks cached.
    assert run["server_metrics"]["prefix_cache_hit_rate"] > 0.7
    assert "prefix-cache hits" in result.stdout


def test_calibrate_then_sweep_draws_the_prediction_beside_the_measurement(
    served: Served, tmp_path: Path
) -> None:
    import asyncio

    from inhouse.bench.calibrate import Probes, Target, calibrate, describe

    probes = Probes(
        prefill_prompts=(64, 320), prefill_repeats=3, decode_batches=(1, 2), decode_output=8,
        long_prompts=(2048,), long_batches=(),
    )  # fmt: skip
    target = Target(served.url, served.model, API_KEY, max_num_seqs=2)
    profile = asyncio.run(calibrate(target, probes))
    assert profile.speculation is None  # the server does not speculate
    measured = profile.measured
    # The long probe is capped at the server's 512-token model length (less its output), and
    # gives a prefill point and a decode point at its context.
    assert [p["prompt_tokens"] for p in measured["prefill"]] == [64, 320, 503]
    assert [(d["batch"], d["context_tokens"] > 500) for d in measured["decode"]] == [
        (1, False), (2, False), (1, True)
    ]  # fmt: skip
    cost = profile.cost
    for point in measured["decode"]:  # three points, three free coefficients: a close fit
        fitted = cost.decode_step(point["batch"], point["context_tokens"])
        assert 0.5 < fitted / point["step_s"] < 2
    assert any(line.startswith("step = ") for line in describe(profile))
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(profile.to_json()))

    out = tmp_path / "sweep"
    result = bench(
        "sweep", *endpoint(served), "--steps", "1,2", "--input-len", "64", "--output-len", "16",
        "--ignore-eos", "--prompts-per-slot", "4", "--min-prompts", "3", "--slo", "ttft=60s",
        "--profile", str(profile_file), "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = load(out)
    prediction = document["prediction"]
    assert [p["concurrency"] for p in prediction["curve"]] == [1, 2]
    comparison = prediction["comparison"]
    assert comparison["predicted_knee"] is None and comparison["measured_knee"] is None
    assert comparison["at"] == 2
    # The fitted model, simulated, lands near what the server then did (a loose band: the
    # host is shared, but a unit slip or a missing queue would land far outside it).
    measured_tpot = document["runs"][1]["summary"]["tpot"]["p50"]
    assert comparison["tpot_measured"] == measured_tpot
    assert 1 / 3 < comparison["tpot_ratio"] < 3
    measured_ttft = document["runs"][0]["summary"]["ttft"]["p50"]
    assert 1 / 3 < measured_ttft / prediction["curve"][0]["ttft_p50"] < 3
    assert "TPOT p50 at concurrency 2: predicted" in " ".join(result.stdout.split())
    png = (out / "latency_vs_concurrency.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
