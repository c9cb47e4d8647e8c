"""The decode roofline against a published measurement, and its compute ceiling."""

from __future__ import annotations

from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model


def test_batch1_bound_puts_vllms_measured_75_tokens_per_s_at_70_to_85_percent() -> None:
    # FACTS: vLLM, Llama-3.1-8B bf16 on an A100-40GB, ~75 tokens/s at batch 1.
    plan = make_plan(load_model("llama-3.1-8b"), PlanInputs(gpu="A100-40G", weights="bf16"))
    bound = plan.roofline.batch1_tokens_per_s
    assert 0.70 <= 75 / bound <= 0.85


def test_large_batches_of_short_sequences_hit_the_compute_ceiling() -> None:
    inputs = PlanInputs(gpu="H100 SXM", weights="bf16", avg_context=64)
    plan = make_plan(load_model("llama-3.1-8b"), inputs)
    roof = plan.roofline
    assert roof.bound_at_batch == "compute"
    assert roof.batch_tokens_per_s == 989e12 / (2 * plan.model.spec.active_params)


def test_tensor_parallel_adds_bandwidth() -> None:
    model = load_model("llama-3.1-70b")
    one = make_plan(model, PlanInputs(gpu="H100", tp=2, weights="bf16"))
    two = make_plan(model, PlanInputs(gpu="H100", tp=4, weights="bf16"))
    assert two.roofline.batch1_tokens_per_s > 1.9 * one.roofline.batch1_tokens_per_s
