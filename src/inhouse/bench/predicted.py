"""A sweep's predicted curve (from a calibration profile) beside the measured one.

The simulator is given the sweep's own workload: the same steps, prompt and output
lengths, and the same number of requests at each step, so both sides see the same
start-up burst. The comparison names both knees, their ratio, and TPOT at the
predicted knee, predicted and measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inhouse.bench.run import RunResult
from inhouse.bench.sweep import Verdict
from inhouse.plan.latency import LatencyPlan, LatencyPoint, Traffic, plan_latency
from inhouse.plan.perf_model import read_profile
from inhouse.plan.sim_engine import SchedulerLimits


@dataclass(frozen=True, slots=True)
class Prediction:
    """The simulated curve at the sweep's steps and where it came from."""

    profile: Path
    latency: LatencyPlan

    def to_json(self) -> dict[str, Any]:
        """Plain data for the results file."""
        return {
            "profile": str(self.profile),
            "slo_ttft_s": self.latency.slo_ttft,
            "curve": [asdict(p) for p in self.latency.points],
            "max_concurrency_within_slo": self.latency.max_within_slo,
            "knee": self.latency.knee,
        }


def predict_sweep(
    profile: Path,
    steps: Sequence[int],
    *,
    input_len: int,
    output_len: int,
    len_spread: float,
    per_slot: int,
    minimum: int,
    slo_ttft: float,
) -> Prediction:
    """Simulate the sweep's steps with the profile's step cost and scheduler settings."""
    loaded = read_profile(profile)
    limits = SchedulerLimits(
        loaded.max_num_seqs, loaded.max_num_batched_tokens, speculation=loaded.speculation
    )
    traffic = Traffic(input_len, output_len, len_spread, per_slot, minimum)
    return Prediction(profile, plan_latency(loaded.cost, limits, traffic, slo_ttft, steps))


@dataclass(frozen=True, slots=True)
class Comparison:
    """Predicted against measured: both knees, their ratio, TPOT at the predicted knee."""

    predicted_knee: int | None
    measured_knee: int | None
    knee_ratio: float | None  # measured / predicted
    at: int  # the step TPOT is compared at: the predicted knee, else the highest step
    tpot_predicted: float
    tpot_measured: float | None
    tpot_ratio: float | None  # measured / predicted

    def to_json(self) -> dict[str, Any]:
        """Plain data for the results file."""
        return asdict(self)

    def lines(self) -> list[str]:
        """What the console prints."""

        def knee(value: int | None) -> str:
            return "none within the steps" if value is None else str(value)

        ratio = "—" if self.knee_ratio is None else f"{self.knee_ratio:.2f}"
        tpot = "—" if self.tpot_measured is None else f"{self.tpot_measured * 1000:.1f} ms"
        tpot_ratio = "—" if self.tpot_ratio is None else f"{self.tpot_ratio:.2f}"
        return [
            f"knee: predicted {knee(self.predicted_knee)} · measured {knee(self.measured_knee)}"
            f" · measured/predicted {ratio}",
            f"TPOT p50 at concurrency {self.at}: predicted {self.tpot_predicted * 1000:.1f} ms"
            f" · measured {tpot} · measured/predicted {tpot_ratio}",
        ]


def _measured_tpot(runs: Sequence[RunResult], concurrency: int) -> float | None:
    run = next((r for r in runs if r.shape.max_concurrency == concurrency), None)
    return None if run is None else run.summary.tpot.p50


def compare(prediction: Prediction, runs: Sequence[RunResult], verdict: Verdict) -> Comparison:
    """Set the prediction beside the sweep's runs and verdict."""
    latency = prediction.latency
    point: LatencyPoint = (latency.point(latency.knee) if latency.knee else None) or (
        latency.points[-1]
    )
    measured = _measured_tpot(runs, point.concurrency)
    knee_ratio = verdict.knee / latency.knee if verdict.knee is not None and latency.knee else None
    return Comparison(
        predicted_knee=latency.knee,
        measured_knee=verdict.knee,
        knee_ratio=knee_ratio,
        at=point.concurrency,
        tpot_predicted=point.tpot_p50,
        tpot_measured=measured,
        tpot_ratio=None if measured is None or not point.tpot_p50 else measured / point.tpot_p50,
    )
