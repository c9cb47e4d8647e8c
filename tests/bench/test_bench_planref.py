import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inhouse.bench.planref import (
    PlanReferenceError,
    plan_prediction,
    predicted_concurrency,
    read_plan_file,
)
from inhouse.cli import app


def test_plan_json_file_and_running_the_planner_agree(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["plan", "llama-3.1-8b", "--gpu", "RTX 4090", "--avg-context", "2000", "--json"]
    )
    assert result.exit_code == 0, result.output
    path = tmp_path / "plan.json"
    path.write_text(result.stdout)
    from_file = read_plan_file(path)
    assert from_file == json.loads(result.stdout)["memory"]["max_concurrent_sequences"]
    assert plan_prediction(str(path), None, avg_context=1) == from_file
    assert plan_prediction("llama-3.1-8b", "RTX 4090", avg_context=2000) == from_file
    assert plan_prediction("llama-3.1-8b", "RTX 4090", avg_context=4000) < from_file


def test_other_tools_documents_and_errors(tmp_path: Path) -> None:
    assert predicted_concurrency({"capacity": [{"max_concurrency": 12}]}) == 12
    with pytest.raises(PlanReferenceError, match="holds none"):
        predicted_concurrency({"memory": {}})
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    with pytest.raises(PlanReferenceError, match="not JSON"):
        read_plan_file(bad)
    with pytest.raises(PlanReferenceError, match="give --gpu"):
        plan_prediction("llama-3.1-8b", None, avg_context=100)
    with pytest.raises(PlanReferenceError, match="inhouse plan:"):
        plan_prediction("no-such-model", "RTX 4090", avg_context=100)
