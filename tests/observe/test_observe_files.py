"""The shipped operations kit: generated files match their generators, promtool accepts the
rules and their unit tests (each alert with a series that fires it and one that must not),
and the dashboard holds together."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import yaml
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.observe.dashboard import dashboard, queries
from inhouse.observe.rules import AlertThresholds, alerting_rules, rules_yaml
from inhouse.observe.scrape import prometheus_yaml
from serving import debian_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULE_TESTS = sorted((DEPLOY / "prometheus").glob("rules*.test.yml"))


def test_shipped_files_are_what_the_generators_write() -> None:
    assert RULES.read_text() == rules_yaml(AlertThresholds())
    assert (DEPLOY / "prometheus" / "prometheus.yml").read_text() == prometheus_yaml(
        "127.0.0.1:8000"
    )
    assert json.loads((DEPLOY / "grafana" / "inhouse.json").read_text()) == dashboard()


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    tool = debian_binary("promtool", "prometheus")
    for args in (
        ["check", "rules", str(RULES)],
        ["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        ["test", "rules", *map(str, RULE_TESTS)],
    ):
        done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_and_a_runbook() -> None:
    tested = {
        case["alertname"]
        for path in RULE_TESTS
        for group in yaml.safe_load(path.read_text())["tests"]
        for case in group["alert_rule_test"]
        if case["exp_alerts"]
    }
    shipped = {rule["alert"] for rule in alerting_rules(AlertThresholds())}
    assert tested == shipped
    for rule in alerting_rules(AlertThresholds(max_num_seqs=8)):
        assert rule["annotations"]["runbook"] and rule["annotations"]["summary"]


def test_slo_and_plan_set_the_thresholds(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"flags": {"max_num_seqs": 37}}))
    out = tmp_path / "rules.yml"
    result = CliRunner().invoke(
        app,
        [
            "observe",
            "rules",
            "--slo",
            "ttft=800ms,tpot=40ms",
            "--plan",
            str(plan),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    alerts = {
        r["alert"]: r
        for g in yaml.safe_load(out.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert alerts["InhouseTTFTAboveSLO"]["expr"].endswith("> 0.8")
    assert alerts["InhouseITLAboveSLO"]["expr"].endswith("> 0.04")
    assert alerts["InhouseBatchFull"]["expr"].endswith(">= 37")
    bad = CliRunner().invoke(app, ["observe", "rules", "--plan", str(out)])
    assert bad.exit_code == 2 and "inhouse plan --json" in bad.output


DASHBOARD_SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating"],
    "properties": {
        "panels": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {
                    "type": {"enum": ["row", "timeseries"]},
                    "gridPos": {
                        "type": "object",
                        "required": ["h", "w", "x", "y"],
                        "properties": {"w": {"maximum": 24}, "x": {"maximum": 23}},
                    },
                    "targets": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "object", "required": ["refId", "expr"]},
                    },
                },
            },
        }
    },
}


def test_dashboard_panels_fit_the_grid_and_use_the_variables() -> None:
    board = dashboard()
    jsonschema.validate(board, DASHBOARD_SCHEMA)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "timeseries":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "model", "backend", "key"}
    assert all('model_name=~"$model"' in q for q in queries())
