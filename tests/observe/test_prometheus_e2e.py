"""A real Prometheus scraping a live gateway and, through its service discovery, the
`inhouse serve` behind it, with the generated rules (short windows) loaded.

After traffic, PromQL over the HTTP API returns the request rate, TTFT p99, KV usage,
per-key tokens and a team's spent budget (its alert fires); every dashboard query returns
data; a long-prompt burst against a tiny KV cache fires the KV alert; killing the backend
fires the backend-down alert; a canary whose candidate is down is rolled back by the
guardrail, which fires the release alert.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from inhouse.gateway.usage.teams import TeamStore
from inhouse.observe.dashboard import queries
from inhouse.observe.rules import AlertThresholds, rules_yaml
from inhouse.observe.scrape import prometheus_yaml
from serving import Process, burst, debian_binary, free_port, gateway_toml, inhouse_command

pytestmark = pytest.mark.slow

RULE_WINDOW = "30s"
PENDING = "2s"
KV_ALERT = 0.55  # one long request alone ends holding ~80% of this test's cache
LONG_PROMPT = [{"role": "user", "content": "Summarise: " + "the cache holds blocks " * 60}]


@dataclass
class Observed:
    prometheus: str
    gateway: str
    backend: Process
    team_secret: str
    tight_secret: str
    plots: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def firing(self, alert: str) -> list[dict[str, Any]]:
        alerts = httpx.get(f"{self.prometheus}/api/v1/alerts").json()["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def wait_firing(self, alert: str, timeout: float, evidence: str = "") -> float:
        """Seconds until ``alert`` fires; on a timeout, what Prometheus holds of the
        ``evidence`` expression (a range selector: the samples the rule read) and of the
        gateway's scrapes."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.firing(alert):
                return time.monotonic() - start
            time.sleep(0.25)
        held = {e: self.query(e) for e in (evidence, 'up{job="inhouse-gateway"}[1m]') if e}
        pytest.fail(f"{alert} not firing after {timeout} s; Prometheus holds {held}")


def _gateway_config(port: int, db_url: str, backend_url: str, key: str) -> str:
    backend = {
        "name": "r1", "url": backend_url, "api_key": key, "model": "SmolLM2-135M-Instruct",
        "capabilities": ["chat", "completions"], "max_context": 512,
    }  # fmt: skip
    return gateway_toml(
        {"port": port, "database": db_url},
        [{"name": "smol", "backends": [backend]}],
        health={"interval_s": 0.5, "timeout_s": 5, "failures_to_down": 1},
        audit={"flush_interval_s": 0.2},
        releases={"guard_interval_s": 0.5},
    )


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    binary = debian_binary("prometheus", "prometheus")
    base = tmp_path_factory.mktemp("prometheus-e2e")
    serve_port, gateway_port, prom_port = free_port(), free_port(), free_port()
    backend_key = secrets.token_urlsafe(24)
    # a float32 KV cache a little over one 512-token sequence: a few long prompts fill it.
    # The dtype is named so a bf16 CPU (whose default halves the bytes a token takes)
    # gets the same cache in tokens as an AVX2-only one.
    backend = Process(
        [*inhouse_command(), "serve", "--port", str(serve_port), "--embedding-model", "none",
         "--max-model-len", "512", "--kv-cache-memory", "24MiB",
         "--dtype", "float32", "--quantization", "fp16"],
        base / "serve.log",
        {"INHOUSE_API_KEY": backend_key},
    )  # fmt: skip
    db_url = f"sqlite:///{base / 'gateway.db'}"
    config_path = base / "inhouse.toml"
    config_path.write_text(
        _gateway_config(gateway_port, db_url, f"http://127.0.0.1:{serve_port}", backend_key)
    )
    gateway = Process(
        [*inhouse_command(), "gateway", "--config", str(config_path)], base / "gateway.log"
    )
    thresholds = AlertThresholds(
        rate_window=RULE_WINDOW, pending=PENDING, backend_down_for=PENDING, kv_usage=KV_ALERT
    )
    (base / "rules.yml").write_text(rules_yaml(thresholds))
    (base / "prometheus.yml").write_text(
        prometheus_yaml(f"127.0.0.1:{gateway_port}", "rules.yml", scrape_interval="1s")
    )
    prometheus = Process(
        [binary, f"--config.file={base / 'prometheus.yml'}",
         f"--storage.tsdb.path={base / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        base / "prometheus.log",
    )  # fmt: skip
    store = KeyStore(open_database(db_url), load_pepper(load_config(config_path)))
    # team-a's traffic overruns its team's warn-only quota: the budget alert, no refusal
    TeamStore(open_database(db_url)).create("search", 86400, quota_tokens=500, hard_stop=False)
    _, team = store.create("team-a", team="search")
    _, tight = store.create("tight", rpm=1)
    procs = [backend, gateway, prometheus]
    try:
        for proc in procs:
            proc.start()
        backend.wait_healthy(f"http://127.0.0.1:{serve_port}/health", 300)
        gateway.wait_healthy(f"http://127.0.0.1:{gateway_port}/health", 60)
        prometheus.wait_healthy(f"http://127.0.0.1:{prom_port}/-/ready", 60)
        yield Observed(
            f"http://127.0.0.1:{prom_port}",
            f"http://127.0.0.1:{gateway_port}",
            backend,
            team,
            tight,
            base,
        )
    finally:
        for proc in procs:
            proc.stop()


def _a_guardrail_rollback_fires_the_release_alert(observed: Observed) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = observed.plots / "inhouse.toml"
    canary = [*inhouse_command(), "release", "canary", "smol", "--backend", dead,
              "--percent", "100", "--config", str(config)]  # fmt: skip
    done = subprocess.run(canary, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    chat = {"model": "smol", "messages": [{"role": "user", "content": "Say hello."}]}
    (reply,) = burst([observed.gateway], observed.team_secret, 1, **chat, max_tokens=1)
    assert reply[0] == 200  # the candidate refused the connection: the stable answered
    rollbacks = 'inhouse:gateway_release_rollbacks_total{model_name="smol"}[1m]'
    observed.wait_firing("InhouseReleaseRolledBack", 30, rollbacks)
    (alert,) = observed.firing("InhouseReleaseRolledBack")
    assert (alert["labels"]["model_name"], alert["labels"]["reason"]) == ("smol", "candidate_down")


def test_metrics_alerts_and_dashboard_against_a_live_prometheus(observed: Observed) -> None:
    """One test on one stack, since it ends by killing the backend and the suite shuffles
    test functions: the release guardrail's rollback first, while the stable is up."""
    _a_guardrail_rollback_fires_the_release_alert(observed)
    urls = [observed.gateway]
    chat = {"model": "smol", "messages": [{"role": "user", "content": "Say hello."}]}
    assert all(r[0] == 200 for r in burst(urls, observed.team_secret, 3, **chat, max_tokens=8))
    streamed = burst(
        urls, observed.team_secret, 2, **chat, max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    assert [r[0] for r in streamed] == [200, 200]
    assert all(r[2][-1].usage.prompt_tokens > 20 for r in streamed)  # read to the usage chunk
    tight = [r[0] for r in burst(urls, observed.tight_secret, 3, **chat, max_tokens=4)]
    assert sorted(tight) == [200, 429, 429]

    # KV pressure: long prompts and answers, more than the cache holds at once; the alert
    # must fire while they run (it resolves once the cache empties). The cache admits one at
    # a time (each may reach 275 + 160 of its ~544 tokens), and each is over the line from
    # its ~24th token on: ~136 decode steps, well past the rule's 2 s pending time (a 0.6
    # line and 128 tokens, ~76 steps over it, did not always once decoding got faster; the
    # gateway's estimate of the prompt, ~352 tokens, caps max_tokens at 160)
    with ThreadPoolExecutor(1) as pool:
        pressure = pool.submit(
            burst, urls, observed.team_secret, 3, model="smol", messages=LONG_PROMPT,
            max_tokens=160, extra_body={"ignore_eos": True},
        )  # fmt: skip
        fired = False
        while not (fired := bool(observed.firing("InhouseKVCacheNearFull"))):
            if pressure.done():
                break
            time.sleep(0.25)
        assert all(r[0] == 200 for r in pressure.result()), pressure.result()
    peak = observed.query("max(max_over_time(model:kv_cache_usage:ratio[5m]))")
    assert fired, f"no KV alert while the cache was under pressure; peak usage {peak}"
    time.sleep(2.5)  # a scrape and a rule evaluation after the last request

    assert observed.query('sum(rate(inhouse:gateway_requests_total{status="200"}[1m]))')
    assert float(observed.query("max(model:time_to_first_token_seconds:p99)")[0]["value"][1]) > 0
    assert float(observed.query("max(model:kv_cache_usage:ratio)")[0]["value"][1]) >= 0
    per_key = {
        r["metric"]["key_name"]: float(r["value"][1])
        for r in observed.query('sum by (key_name) (inhouse:gateway_tokens_total{kind="prompt"})')
    }
    assert per_key["team-a"] > per_key["tight"] > 0
    answered = observed.query('sum(inhouse:gateway_requests_total{status="200"})')[0]
    prompts = observed.query('sum(inhouse:gateway_tokens_total{kind="prompt"})')[0]
    creep = observed.query("max(inhouse:gateway_mean_prompt_tokens)")[0]
    # every request so far was answered whole and is inside the creep window, so the gauge,
    # the mean of the prompt tokens backends reported (several times the old estimate,
    # characters / 4, of "Say hello."), is the charged prompt tokens per answer
    mean = float(prompts["value"][1]) / float(answered["value"][1])
    assert float(creep["value"][1]) == pytest.approx(mean, rel=0.01)
    rejected = observed.query("sum by (key_name, reason) (inhouse:gateway_rejections_total)")
    assert {r["metric"]["key_name"] for r in rejected} == {"tight"}
    spent = observed.query("inhouse:gateway_team_budget_used_ratio")
    assert [(r["metric"]["team"], r["metric"]["budget"]) for r in spent] == [("search", "tokens")]
    assert float(spent[0]["value"][1]) > 1
    observed.wait_firing("InhouseTeamBudgetSpent", 10)
    assert not observed.firing("InhouseTeamBudgetNearlySpent")  # past 100 %: the other alert

    empty = []
    for expr in queries():
        concrete = expr.replace("$__rate_interval", "1m")
        for variable in ("$model", "$backend", "$key"):
            concrete = concrete.replace(variable, ".*")
        if not observed.query(concrete):
            empty.append(expr)
    assert not empty, f"dashboard queries with no data: {empty}"
    _plot_ttft(observed)

    observed.backend.kill()
    waited = observed.wait_firing("InhouseBackendDown", 20)
    assert waited < 20


def _plot_ttft(observed: Observed) -> None:
    """One panel's data as a PNG in the test's folder, to look at."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    now = time.time()
    body = httpx.get(
        f"{observed.prometheus}/api/v1/query_range",
        params={"query": "model:time_to_first_token_seconds:p99", "start": now - 120, "end": now,
                "step": "1s"},
    ).json()  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 3))
    for series in body["data"]["result"]:
        times = [float(t) - now for t, _ in series["values"]]
        ax.plot(times, [float(v) for _, v in series["values"]], label=series["metric"]["instance"])
    ax.set(xlabel="seconds before now", ylabel="TTFT p99 (s)", title="Time to first token, p99")
    ax.legend()
    fig.savefig(observed.plots / "ttft_p99.png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    assert (observed.plots / "ttft_p99.png").stat().st_size > 0
