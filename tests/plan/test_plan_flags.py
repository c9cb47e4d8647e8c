"""Recommended flags and the defaults behind them."""

from __future__ import annotations

from inhouse.launch.emit import plan_flags
from inhouse.plan.capacity import default_overhead_bytes
from inhouse.plan.planner import Plan, PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.units import GIB, MIB, parse_bytes


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def inhouse_serve_flags(plan: Plan) -> list[str]:
    return plan_flags("inhouse", plan).argv


def vllm_serve_flags(plan: Plan) -> list[str]:
    return plan_flags("vllm", plan).argv


def test_max_num_seqs_is_80_percent_of_capacity_in_both_servers() -> None:
    plan = make_plan(load_model("qwen2.5-7b"), PlanInputs(gpu="A100-80G"))
    expected = str(int(plan.max_concurrent * 0.8))
    assert _flag(inhouse_serve_flags(plan), "--max-num-seqs") == expected
    assert _flag(vllm_serve_flags(plan), "--max-num-seqs") == expected


def test_inhouse_serve_gets_the_kv_budget_in_whole_mib() -> None:
    plan = make_plan(load_model("qwen3-8b"), PlanInputs(gpu="L40S"))
    memory = _flag(inhouse_serve_flags(plan), "--kv-cache-memory")
    assert memory == f"{plan.kv_budget // MIB}MiB"
    assert 0 <= plan.kv_budget - parse_bytes(memory) < MIB


def test_awq_serves_in_float16_with_a_float16_kv_cache() -> None:
    plan = make_plan(load_model("llama-3.1-70b"), PlanInputs(gpu="A100-80G", weights="awq"))
    assert plan.inputs.kv_dtype == "fp16"
    flags = vllm_serve_flags(plan)
    assert _flag(flags, "--quantization") == "awq"
    assert _flag(flags, "--dtype") == "float16"
    assert _flag(inhouse_serve_flags(plan), "--dtype") == "float16"


def test_fp8_kv_cache_halves_kv_and_is_passed_to_vllm() -> None:
    model = load_model("llama-3.1-8b")
    bf16 = make_plan(model, PlanInputs(gpu="RTX 4090"))
    fp8 = make_plan(model, PlanInputs(gpu="RTX 4090", kv_dtype="fp8"))
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert _flag(vllm_serve_flags(fp8), "--kv-cache-dtype") == "fp8"
    assert "--kv-cache-dtype" not in vllm_serve_flags(bf16)


def test_tensor_parallel_flag_only_with_several_gpus() -> None:
    model = load_model("llama-3.1-70b")
    assert (
        _flag(
            vllm_serve_flags(make_plan(model, PlanInputs(gpu="H100", tp=4))),
            "--tensor-parallel-size",
        )
        == "4"
    )
    single = make_plan(model, PlanInputs(gpu="H200", weights="fp8"))
    assert "--tensor-parallel-size" not in vllm_serve_flags(single)


def test_default_max_model_len_is_twice_the_average_at_least_8192() -> None:
    model = load_model("llama-3.1-8b")
    assert make_plan(model, PlanInputs(gpu="H100")).max_model_len == 8192
    assert make_plan(model, PlanInputs(gpu="H100", avg_context=12000)).max_model_len == 32768


def test_default_max_model_len_is_capped_by_what_fits() -> None:
    plan = make_plan(load_model("llama-3.1-8b"), PlanInputs(gpu="L4", avg_context=20000))
    assert plan.max_model_len <= plan.largest_context
    assert plan.fits


def test_default_overhead_grows_with_model_size() -> None:
    overhead = [
        default_overhead_bytes(load_model(name).spec.total_params)
        for name in ("smollm2", "llama-3.1-8b", "llama-3.1-70b", "deepseek-v3")
    ]
    assert overhead == [1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB]
    plan = make_plan(load_model("llama-3.1-8b"), PlanInputs(gpu="H100"))
    assert plan.overhead_is_default and plan.overhead_bytes == 2 * GIB
