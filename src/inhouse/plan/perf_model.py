"""How long one engine step takes: a roofline with calibrated efficiencies, or a measured profile.

A step of a continuous-batching engine prefills some prompt tokens and decodes some
sequences in one forward pass. Its time is modelled as

    step = base + max(weights_s, token_s · tokens) + seq_s · decodes
                + context_s · decode_context + pair_s · prefill_pairs

- ``weights_s``: streaming the weights once (memory-bound floor of every step);
- ``token_s · tokens``: the matmul FLOPs of every token in the step (compute bound);
- ``seq_s``: per decoding sequence (sampling, detokenizing, streaming, KV gather);
- ``context_s``: per context token a decode attends over (reading its KV);
- ``pair_s``: per (query, key) pair a prefill's attention computes (quadratic in prompt).

A request's TTFT adds ``request_s`` once (HTTP, tokenizing, template). Pure Python.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inhouse.plan.errors import PlanError
from inhouse.plan.speculation import Speculation, speculation_from_json

PROFILE_KIND = "inhouse-step-profile"

# Published vLLM: Llama-3.1-8B bf16 on A100-40GB decodes ~75 tok/s at batch 1, 77% of the
# 97 tok/s bandwidth bound (FACTS); a dense bf16 GEMM at large batch reaches ~60% of peak.
GPU_BANDWIDTH_EFFICIENCY = 0.77
GPU_FLOPS_EFFICIENCY = 0.6
# vLLM's per-step CPU work (scheduling, sampling, detokenizing) with CUDA graphs: ~1 ms.
GPU_STEP_OVERHEAD_S = 0.001
GPU_SEQ_OVERHEAD_S = 0.00003


@dataclass(frozen=True, slots=True)
class StepCost:
    """Coefficients of the step-time model (seconds); ``source`` says where they came from."""

    base_s: float
    weights_s: float
    token_s: float
    seq_s: float
    context_s: float
    pair_s: float
    request_s: float = 0.0
    source: str = "roofline"

    def __post_init__(self) -> None:
        for name in ("base_s", "weights_s", "token_s", "seq_s", "context_s", "pair_s", "request_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise PlanError(f"step cost {name} must be a non-negative number, not {value!r}")

    def step_time(
        self, prefill_tokens: int, decodes: int, decode_context: int, prefill_pairs: int
    ) -> float:
        """Seconds one step takes with this batch."""
        tokens = prefill_tokens + decodes
        return (
            self.base_s
            + max(self.weights_s, self.token_s * tokens)
            + self.seq_s * decodes
            + self.context_s * decode_context
            + self.pair_s * prefill_pairs
        )

    def decode_step(self, batch: int, context: int) -> float:
        """A pure decode step of `batch` sequences, each `context` tokens long."""
        return self.step_time(0, batch, batch * context, 0)

    def prefill_step(self, prompt: int) -> float:
        """One whole prompt prefilled alone in one step."""
        return self.step_time(prompt, 0, 0, prefill_pairs(0, prompt))


def prefill_pairs(done: int, chunk: int) -> int:
    """(query, key) pairs causal attention computes for tokens done+1 … done+chunk."""
    return chunk * done + chunk * (chunk + 1) // 2


@dataclass(frozen=True, slots=True)
class Hardware:
    """What a roofline needs: bytes/s, FLOP/s, and the fixed costs per step and per sequence."""

    name: str
    bandwidth_bytes_per_s: float
    flops: float
    bandwidth_efficiency: float
    flops_efficiency: float
    step_overhead_s: float
    seq_overhead_s: float


def roofline_cost(
    hardware: Hardware,
    *,
    weight_bytes: int,
    active_params: int,
    kv_bytes_per_token: int,
    attention_width: int,
) -> StepCost:
    """Step cost from bandwidth and FLOPs. `attention_width` = layers · heads · head_dim, so a
    (query, key) pair costs 4 · width FLOPs (QKᵀ and PV)."""
    bandwidth = hardware.bandwidth_bytes_per_s * hardware.bandwidth_efficiency
    flops = hardware.flops * hardware.flops_efficiency
    return StepCost(
        base_s=hardware.step_overhead_s,
        weights_s=weight_bytes / bandwidth,
        token_s=2 * active_params / flops,
        seq_s=hardware.seq_overhead_s,
        context_s=kv_bytes_per_token / bandwidth,
        pair_s=4 * attention_width / flops,
        request_s=0.0,
        source=f"roofline: {hardware.name}",
    )


@dataclass(frozen=True, slots=True)
class Profile:
    """A calibration profile: the fitted step cost, the server's scheduler, the probes' points,
    and the measured speculation (None: the server did not speculate)."""

    cost: StepCost
    model: str
    max_num_seqs: int
    max_num_batched_tokens: int
    measured: dict[str, Any]
    speculation: Speculation | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain data for the profile file."""
        return {
            "kind": PROFILE_KIND,
            "model": self.model,
            "step_cost": asdict(self.cost),
            "scheduler": {
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
            },
            "measured": self.measured,
            "speculation": self.speculation.to_json() if self.speculation else None,
        }


def profile_from_json(document: Any) -> Profile:
    """Read what `Profile.to_json` wrote; a clear PlanError for anything else."""
    if not isinstance(document, dict) or document.get("kind") != PROFILE_KIND:
        raise PlanError(
            f'not a step profile (no "kind": "{PROFILE_KIND}"); write one with '
            "`inhouse bench calibrate`"
        )
    try:
        cost = StepCost(**document["step_cost"])
        scheduler = document["scheduler"]
        return Profile(
            cost=cost,
            model=str(document["model"]),
            max_num_seqs=int(scheduler["max_num_seqs"]),
            max_num_batched_tokens=int(scheduler["max_num_batched_tokens"]),
            measured=dict(document.get("measured") or {}),
            speculation=speculation_from_json(document.get("speculation")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"the step profile is incomplete or malformed: {exc}") from exc


def read_profile(path: Path) -> Profile:
    """The profile in a JSON file written by `inhouse bench calibrate`."""
    try:
        return profile_from_json(json.loads(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise PlanError(f"cannot read profile {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise PlanError(f"profile {path} is not JSON: {exc.msg}") from exc
