"""`inhouse release` on a real SQLite file: each command one change with its line of
output, refusals as one sentence and exit 1, status as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from serving import gateway_toml


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "inhouse.toml"
    q4 = {"name": "q4", "url": "http://127.0.0.1:9001", "adapters": ["support", "support-v2"]}
    models = [
        {"name": "smol", "backends": [q4]},
        {"name": "smol-q8", "backends": [{"name": "q8", "url": "http://127.0.0.1:9002"}]},
    ]
    path.write_text(gateway_toml({"database": f"sqlite:///{tmp_path / 'gateway.db'}"}, models))
    return path


def _release(config: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["release", *args, "--config", str(config)])
    return result.exit_code, result.output


def test_canary_widen_promote_rollback_and_status(config: Path) -> None:
    code, out = _release(config, "canary", "smol", "--backend", "q8", "--percent", "10",
                         "--shadow", "5", "--by", "ana", "--reason", "q8",
                         "--sampling", '{"temperature": 0.2}', "--max-output", "256")  # fmt: skip
    assert code == 0 and "candidate release 2 at 10% of keys (shadow 5%)" in out
    assert _release(config, "canary", "smol", "--percent", "50")[0] == 0
    code, out = _release(config, "status", "smol", "--json")
    status = json.loads(out)
    assert status["state"]["percent"] == 50 and status["state"]["candidate"] == 2
    assert status["releases"][1]["backends"][0]["name"] == "q8"
    assert status["releases"][1]["sampling"] == {"temperature": 0.2}
    assert status["candidate"]["requests"] == 0 and status["candidate"]["errors"]["n"] == 0
    assert _release(config, "promote", "smol", "--by", "bo")[1].startswith("smol: stable release 2")
    code, out = _release(config, "rollback", "smol", "--reason", "complaints")
    assert code == 0 and out.startswith("smol: stable release 1")
    code, out = _release(config, "status", "smol")
    assert code == 0 and "complaints" in out and "promote" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["promote", "smol"], "has no releases yet"),
        (["canary", "smol", "--backend", "nope", "--percent", "5"], "no backend named 'nope'"),
        (["canary", "smol", "--backend", "q8", "--percent", "150"], "between 0 and 100"),
        (["canary", "smol", "--backend", "http://h", "--kind", "tgi", "--percent", "5"], "--kind"),
        (
            ["canary", "smol", "--backend", "q8", "--percent", "5", "--sampling", "[1]"],
            "--sampling must be a JSON object",
        ),
        (
            ["canary", "smol", "--backend", "q8", "--percent", "5", "--max-error-rate", "3"],
            "max_error_rate must be between 0 and 1",
        ),
        (["canary", "other", "--backend", "q8", "--percent", "5"], "not in the gateway config"),
        (["compare", "smol"], "no candidate and no shadow pairs"),
        (
            ["canary", "smol", "--backend", "q8", "--percent", "5", "--adapter", "v2"],
            "--adapter is for a LoRA adapter's releases",
        ),
        (
            ["canary", "support", "--backend", "q4", "--percent", "5", "--adapter", "smol-q8"],
            "is a model's name, not an adapter's",
        ),
    ],
    ids=[
        "promote",
        "unknown-backend",
        "share",
        "kind",
        "sampling",
        "guardrail",
        "model",
        "compare",
        "adapter-of-a-model",
        "adapter-named-as-a-model",
    ],
)
def test_refusals_are_one_sentence_and_exit_1(config: Path, args: list[str], message: str) -> None:
    code, out = _release(config, *args)
    assert code == 1 and message in out and "Traceback" not in out


def test_an_adapter_has_releases_of_its_own_on_its_base_backends(config: Path) -> None:
    code, out = _release(config, "canary", "support", "--backend", "q4", "--adapter",
                         "support-v2", "--percent", "10")  # fmt: skip
    assert code == 0 and out.startswith("support: stable release 1, candidate release 2 at 10%")
    status = json.loads(_release(config, "status", "support", "--json")[1])
    first, candidate = status["releases"]
    assert (first["backends"][0]["name"], first["adapter"]) == ("q4", None)
    assert (candidate["backends"][0]["name"], candidate["adapter"]) == ("q4", "support-v2")
    assert json.loads(_release(config, "status", "smol", "--json")[1])["state"] is None
    code, out = _release(config, "rollback", "support")
    assert code == 0 and out.startswith("support: stable release 1 ·")


def test_a_first_canary_without_the_config_asks_for_it(config: Path, tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    args = ["release", "canary", "smol", "--backend", "http://127.0.0.1:9", "--percent", "5"]
    first = CliRunner().invoke(app, [*args, "--database", database])
    assert first.exit_code == 1 and "give the gateway config (--config)" in first.output
    assert _release(config, "canary", "smol", "--backend", "q8", "--percent", "5")[0] == 0
    wider = ["release", "canary", "smol", "--percent", "20", "--database", database]
    assert CliRunner().invoke(app, wider).exit_code == 0  # later changes need only the database
