"""Where a plan's step cost comes from: a GPU's roofline, a CPU's, or a calibration profile.

The CPU constants were calibrated on this project's build hosts (2-core AMD EPYC, the
bundled SmolLM2-135M through `inhouse serve`, see
docs/archive/benchmarks-2026-11-30_12-01.md): a small model there is bound by per-step dispatch
and per-sequence work, not by bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.plan.errors import PlanError
from inhouse.plan.gpus import GpuSpec
from inhouse.plan.perf_model import (
    GPU_BANDWIDTH_EFFICIENCY,
    GPU_FLOPS_EFFICIENCY,
    GPU_SEQ_OVERHEAD_S,
    GPU_STEP_OVERHEAD_S,
    Hardware,
    StepCost,
    roofline_cost,
)
from inhouse.plan.planner import Plan

# Fitted to `inhouse serve`'s quiet-host TPOT for the bundled model (fp16 weights, 2 threads,
# docs/archive/benchmarks-2026-11-30_12-01.md: 29.2 / 32.1 / 63.8 ms at c = 1 / 4 / 16);
# this roofline gives 30 / 34 / 63.
CPU_BANDWIDTH_EFFICIENCY = 0.6
CPU_GFLOPS_PER_CORE = 96.0  # fp32 FMA peak of an AVX2 core at ~3 GHz (2 units × 8 lanes × 2)
CPU_FLOPS_EFFICIENCY = 0.7
CPU_STEP_OVERHEAD_S = 0.012  # per-op dispatch of a 30-layer model, ~7 µs an op
CPU_SEQ_OVERHEAD_S = 0.0012  # sampling, detokenizing and one SSE event per sequence
# Said under every uncalibrated --cpu latency table: the constants above predate the kernels.
CPU_ROOFLINE_NOTE = (
    "Uncalibrated: a roofline guess whose constants were fitted to serve's older fp16 path on "
    "a 2-core AVX2 EPYC; on hosts where serve's C++ kernels run it is pessimistic, 3-4x on a "
    "2-core AMX Xeon (the bundled model: 5.9 ms TPOT and 167 tok/s at c=1 where these "
    "defaults say 20 ms and 42). For this host's own figures: start `inhouse serve`, run "
    "`inhouse bench calibrate --base-url URL --model NAME --out profile.json`, then "
    "`inhouse plan --profile profile.json`."
)


@dataclass(frozen=True, slots=True)
class CpuTarget:
    """A CPU host: memory, cores and memory bandwidth."""

    ram_bytes: int
    cores: int
    bandwidth_bytes_per_s: float
    gflops_per_core: float = CPU_GFLOPS_PER_CORE

    def __post_init__(self) -> None:
        if self.cores < 1 or not self.bandwidth_bytes_per_s > 0 or self.ram_bytes < 1:
            raise PlanError("--cpu needs --cores ≥ 1, a positive --mem-bandwidth and --ram")

    def hardware(self) -> Hardware:
        """The roofline inputs for this host."""
        return Hardware(
            name=f"CPU, {self.cores} cores, {self.bandwidth_bytes_per_s / 1e9:g} GB/s",
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            flops=self.cores * self.gflops_per_core * 1e9,
            bandwidth_efficiency=CPU_BANDWIDTH_EFFICIENCY,
            flops_efficiency=CPU_FLOPS_EFFICIENCY,
            step_overhead_s=CPU_STEP_OVERHEAD_S,
            seq_overhead_s=CPU_SEQ_OVERHEAD_S,
        )


def gpu_hardware(gpu: GpuSpec, tp: int = 1) -> Hardware:
    """A GPU (× tensor parallel) with efficiencies calibrated on published vLLM figures."""
    return Hardware(
        name=f"{tp} × {gpu.name}" if tp > 1 else gpu.name,
        bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s * tp,
        flops=gpu.bf16_tflops * 1e12 * tp,
        bandwidth_efficiency=GPU_BANDWIDTH_EFFICIENCY,
        flops_efficiency=GPU_FLOPS_EFFICIENCY,
        step_overhead_s=GPU_STEP_OVERHEAD_S,
        seq_overhead_s=GPU_SEQ_OVERHEAD_S,
    )


def plan_roofline_cost(plan: Plan, hardware: Hardware) -> StepCost:
    """The step cost of the planned model, weights and KV dtype on `hardware` (all GPUs)."""
    spec = plan.model.spec
    return roofline_cost(
        hardware,
        weight_bytes=plan.weights.read_per_step(spec),
        active_params=spec.active_params,
        kv_bytes_per_token=plan.kv_bytes_per_token * plan.inputs.tp,
        attention_width=spec.num_layers * spec.num_attention_heads * spec.head_dim,
    )
