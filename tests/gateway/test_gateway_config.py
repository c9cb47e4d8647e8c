"""Gateway TOML: every documented key parses, and mistakes get one clear error."""

from pathlib import Path

import pytest

from inhouse.gateway.config import ConfigError
from inhouse.gateway.config_file import load_config, parse_config

FULL = """
[gateway]
host = "0.0.0.0"
port = 9000
database = "sqlite:////tmp/x.db"
pepper_file = "/tmp/x.pepper"
shared_limits = true
request_timeout_s = 120
access_log = false
max_request_body = 65536

[health]
interval_s = 2
timeout_s = 1
failures_to_down = 3
successes_to_up = 1

[audit]
flush_interval_s = 0.2
batch_size = 50
redact = ["secret-\\\\d+"]
creep_window = 10

[[models]]
name = "smol"
policy = "fallback"
allow_fallback = true
queue_max_depth = 8
queue_max_wait_s = 5
default_max_tokens = 256

[[models.backends]]
name = "a"
url = "http://127.0.0.1:8001/"
api_key = "k1"
model = "SmolLM2-135M-Instruct"
kind = "inhouse"
weight = 2
max_in_flight = 16
capabilities = ["chat", "completions", "tools"]
max_context = 2048
max_output = 512

[models.fallback]
url = "https://api.example.com"
api_key_env = "FALLBACK_KEY_FOR_TEST"
model = "gpt-4o-mini"
kind = "openai"
capabilities = ["chat", "vision"]
"""


def test_every_key_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FALLBACK_KEY_FOR_TEST", "fb-key")
    path = tmp_path / "inhouse.toml"
    path.write_text(FULL)
    config = load_config(path)
    assert (config.host, config.port, config.shared_limits) == ("0.0.0.0", 9000, True)
    assert not config.access_log and parse_config(_minimal()).access_log
    assert config.max_request_body == 65536
    assert config.health.interval_s == 2 and config.audit.redact == ("secret-\\d+",)
    model = config.model("smol")
    assert model is not None and model.policy == "fallback" and model.queue_max_depth == 8
    backend = model.backends[0]
    assert backend.url == "http://127.0.0.1:8001" and backend.weight == 2
    assert backend.capabilities.supports("tools") and not backend.capabilities.supports("vision")
    assert backend.capabilities.max_context == 2048 and backend.saltable
    assert model.fallback is not None and model.fallback.api_key == "fb-key"
    assert not model.fallback.saltable


def _minimal(**model: object) -> dict:
    backend = {"url": "http://127.0.0.1:1"}
    return {"models": [{"name": "m", "backends": [backend], **model}]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"models": []}, "at least one"),
        ({"gateway": {"prot": 1}, **_minimal()}, "unknown key(s) in gateway: prot"),
        (_minimal(policy="drop"), "policy must be"),
        (_minimal(policy="fallback"), "needs a [models.fallback]"),
        ({"models": [{"name": "m", "backends": [{"url": "ftp://x"}]}]}, "http(s) URL"),
        (
            {
                "models": [
                    {"name": "m", "backends": [{"url": "http://x", "capabilities": ["audio"]}]}
                ]
            },
            "audio",
        ),
        ({"models": [{"name": "m"}]}, "at least one [[models.backends]]"),
        (_minimal(queue_max_depth=-1), ">= 0"),
        ({"gateway": {"max_request_body": 0}, **_minimal()}, "positive integer"),
        ({"gateway": {"trusted_proxies": ["*"]}, **_minimal()}, "not an IP address or network"),
        ({"gateway": {"trusted_proxies": "10.0.0.1"}, **_minimal()}, "must be a list"),
        (
            {"gateway": {"metrics_token_env": "INHOUSE_TEST_SURELY_UNSET"}, **_minimal()},
            "$INHOUSE_TEST_SURELY_UNSET is not set",
        ),
    ],
)
def test_mistakes_are_named(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert message in str(err.value)


def test_proxies_the_metrics_token_and_every_held_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INHOUSE_TEST_TOKEN", "scrape-token-1")
    data = _minimal()
    data["models"][0]["backends"][0]["api_key"] = "backend-key-1"
    gateway = {"trusted_proxies": ["10.0.0.0/8", "::1"], "metrics_token_env": "INHOUSE_TEST_TOKEN"}
    config = parse_config({"gateway": gateway, **data})
    assert config.trusted_proxies == ("10.0.0.0/8", "::1")
    assert config.metrics_token == "scrape-token-1"
    assert config.held_secrets() == ["backend-key-1", "scrape-token-1"]
    assert parse_config(_minimal()).metrics_token is None  # /metrics public, as before


def test_defaults_keep_a_bounded_queue() -> None:
    route = parse_config(_minimal()).models[0]
    assert route.policy == "queue" and route.queue_max_depth == 64 and route.queue_max_wait_s == 30
