"""`inhouse plan` end to end through the CLI: report, JSON, flags, and every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from published_configs import LLAMA_3_1_8B
from typer.testing import CliRunner

from inhouse.launch.plan_command import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, plan

app = typer.Typer()
app.command()(plan)


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_one_sentence_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("inhouse plan: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_report_shows_the_seed_example_numbers() -> None:
    result = run(
        "llama-3.1-8b",
        "--vram", "24GiB", "--util", "1.0", "--overhead", "2GiB", "--avg-context", "4000",
        "--weights", "fp16",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "128 KiB" in out and "500 MiB" in out
    assert "Verdict: fits: 14 sequences of 4,000 tokens fit at once." in out
    assert "16.06 GB = 14.96 GiB" in out  # both unit conventions, named
    assert "vllm serve Llama-3.1-8B" in out and "--max-num-seqs 11" in out  # 80% of 14
    assert "inhouse serve Llama-3.1-8B" in out and "--kv-cache-memory" in out


def test_json_carries_the_same_numbers() -> None:
    result = run("qwen3-30b-a3b", "--gpu", "H100-SXM", "--json", "--weights", "fp8")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    memory = data["memory"]
    assert memory["kv_bytes_per_token"] == 2 * 48 * 4 * 128 * 2
    assert memory["fits"] is True
    assert data["model"]["active_params"] < data["model"]["total_params"] / 8
    assert data["gpu"]["memory_bytes"] == 80 * 1024**3
    assert data["kv_cache"]["num_tokens"] == data["kv_cache"]["num_blocks"] * 16
    assert data["roofline"]["batch1_tokens_per_s"] > 0
    vllm = data["flags"]["vllm_serve"]
    assert vllm[vllm.index("--max-num-seqs") + 1] == str(
        int(memory["max_concurrent_sequences"] * 0.8)
    )
    assert vllm[vllm.index("--quantization") + 1] == "fp8"


def test_explain_spells_out_the_arithmetic() -> None:
    result = run("llama-2-70b", "--gpu", "a100-80g", "--tp", "2", "--explain")
    assert result.exit_code == 0, result.stderr
    assert "2 × 80 × 4 KV heads × 128 × 2 B" in result.stdout
    assert "--tensor-parallel-size 2" in result.stdout


def test_config_json_input(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_3_1_8B))
    result = run(str(path), "--gpu", "L40S", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["memory"]["kv_bytes_per_token"] == 128 * 1024


@pytest.mark.slow
def test_default_is_the_bundled_gguf_with_its_real_tensors() -> None:
    result = run("--explain")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "30 layers" in out and "9 heads / 3 KV heads" in out and "head_dim 64" in out
    assert "gguf (Q4_1)" in out and "Q4_1 ×210" in out
    assert "2 × 30 × 3 KV heads × 64 × 2 B" in out


def test_missing_file() -> None:
    assert_one_sentence_error(run("/no/such/config.json"), EXIT_BAD_INPUT, "no such file")


def test_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert_one_sentence_error(run(str(path)), EXIT_BAD_INPUT, "is not valid JSON")


def test_config_lacking_a_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA_3_1_8B.items() if k != "vocab_size"}))
    assert_one_sentence_error(run(str(path)), EXIT_BAD_INPUT, "lacks field 'vocab_size'")


def test_unknown_gpu() -> None:
    result = run("llama-3.1-8b", "--gpu", "GTX 1080")
    assert_one_sentence_error(result, EXIT_BAD_INPUT, "unknown GPU 'GTX 1080'", "H100 SXM")


def test_unknown_weight_format() -> None:
    result = run("llama-3.1-8b", "--weights", "nf3")
    assert_one_sentence_error(result, EXIT_BAD_INPUT, "unknown weight format 'nf3'")


def test_bad_size() -> None:
    result = run("llama-3.1-8b", "--vram", "lots")
    assert_one_sentence_error(result, EXIT_BAD_INPUT, "cannot read 'lots' as a size")


def test_tp_not_dividing_kv_heads(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_3_1_8B, "num_attention_heads": 48, "hidden_size": 6144}))
    result = run(str(path), "--tp", "3")
    assert_one_sentence_error(result, EXIT_BAD_INPUT, "does not divide the 8 KV heads")


def test_average_context_beyond_the_model() -> None:
    result = run("llama-2-70b", "--avg-context", "8000")
    assert_one_sentence_error(result, EXIT_BAD_INPUT, "longer than the 4,096 positions")


def test_model_that_does_not_fit() -> None:
    result = run("llama-3.1-70b", "--gpu", "rtx4090")
    assert_one_sentence_error(
        result, EXIT_DOES_NOT_FIT, "Llama-3.1-70B does not fit", "exceed the 21.60 GiB usable"
    )


def test_max_model_len_beyond_what_fits() -> None:
    result = run("llama-3.1-8b", "--gpu", "L4", "--max-model-len", "131072")
    assert_one_sentence_error(result, EXIT_DOES_NOT_FIT, "--max-model-len 131,072 needs more KV")


def test_does_not_fit_still_prints_json_for_machines() -> None:
    result = run("deepseek-v3", "--gpu", "h200", "--json")
    assert result.exit_code == EXIT_DOES_NOT_FIT
    assert json.loads(result.stdout)["memory"]["fits"] is False
    assert "DeepSeek-V3 does not fit" in result.stderr


def test_inhouse_plan_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from inhouse.cli import app\n"
        "try:\n"
        "    app(['plan', 'llama-3.1-8b', '--json'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code in (0, None), exit.code\n"
        "assert 'torch' not in sys.modules, 'inhouse plan imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
