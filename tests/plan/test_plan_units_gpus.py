"""Sizes people type, units we print, and the GPU catalogue."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from inhouse.launch.plan_command import plan
from inhouse.plan.errors import PlanError
from inhouse.plan.gpus import find_gpu
from inhouse.plan.units import GB, GIB, MIB, binary, both, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * GIB),
        ("24 GB", 24 * GB),
        ("512MiB", 512 * MIB),
        ("1.5GiB", 3 * GIB // 2),
        ("1000", 1000),
        ("2gib", 2 * GIB),
    ],
)
def test_parse_bytes_reads_binary_and_decimal_units(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "24 GiBs", "-1GiB", "lots"])
def test_parse_bytes_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(PlanError, match="cannot read"):
        parse_bytes(text)


def test_printed_sizes_name_their_unit() -> None:
    assert binary(128 * 1024) == "128 KiB"
    assert binary(500 * MIB) == "500 MiB"
    assert both(16_000_000_000) == "16.00 GB = 14.90 GiB"


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("h100-sxm", "H100 SXM"),
        ("H100", "H100 SXM"),
        ("A100-80GB", "A100 80G SXM"),
        ("a100 40g sxm", "A100 40G SXM"),
        ("rtx4090", "RTX 4090"),
        ("4090", "RTX 4090"),
        ("mi300x", "MI300X"),
    ],
)
def test_gpu_names_are_forgiving(typed: str, name: str) -> None:
    assert find_gpu(typed).name == name


def test_gpu_memory_is_binary_and_bandwidth_decimal() -> None:
    gpu = find_gpu("RTX 4090")
    assert gpu.memory_bytes == 24 * GIB
    assert gpu.bandwidth_bytes_per_s == 1.008e12


def test_gpus_is_an_alias_of_tp() -> None:
    app = typer.Typer()
    app.command()(plan)
    result = CliRunner().invoke(app, ["llama-3.1-70b", "--gpu", "h100", "--gpus", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["gpu"]["count"] == 2
    assert "--tensor-parallel-size" in data["flags"]["vllm_serve"]
