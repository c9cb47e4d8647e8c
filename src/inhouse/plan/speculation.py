"""What the plan assumes about speculative decoding: the engine's draft length and gate, and the
acceptance a calibration measured (`inhouse bench calibrate`'s acceptance probe).

While at most ``disable_by_batch_size`` sequences decode, each decoding sequence is verified
with ``mean_draft_length`` draft tokens in the same step (that many extra rows of the batch;
the engine's adaptive length keeps it below ``num_speculative_tokens``, a profile without it
means K) and advances by ``mean_accepted_length`` tokens a step (vLLM's 1 + accepted / drafts).
Acceptance depends on the workload: text copied or edited from the prompt accepts many
drafts, free writing few.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from inhouse.plan.errors import PlanError


@dataclass(frozen=True, slots=True)
class Speculation:
    """Draft length K, the batch-size gate (None: always drafts), and measured acceptance."""

    num_speculative_tokens: int
    disable_by_batch_size: int | None
    acceptance_rate: float
    mean_accepted_length: float
    requests: int = 0
    mean_draft_length: float | None = None  # draft tokens / drafts; None: K

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
            raise PlanError(f"num_speculative_tokens must be an integer 1 … 64, not {k!r}")
        gate = self.disable_by_batch_size
        if gate is not None and (isinstance(gate, bool) or not isinstance(gate, int) or gate < 1):
            raise PlanError(f"disable_by_batch_size must be an integer ≥ 1 or null, not {gate!r}")
        rate = self.acceptance_rate
        if not _number(rate) or not 0 <= rate <= 1:
            raise PlanError(f"the acceptance rate must be a number in [0, 1], not {rate!r}")
        length = self.mean_accepted_length
        if not _number(length) or not 1 <= length <= k + 1:
            raise PlanError(
                f"the mean accepted length must be a number in [1, {k + 1}] "
                f"(1 + num_speculative_tokens), not {length!r}"
            )
        drafted = self.mean_draft_length
        if drafted is not None and (not _number(drafted) or not 1 <= drafted <= k):
            raise PlanError(f"the mean draft length must be a number in [1, {k}], not {drafted!r}")
        count = self.requests
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise PlanError(f"the acceptance probe's request count must be ≥ 0, not {count!r}")

    @property
    def rows_per_draft(self) -> int:
        """The extra rows a decoding sequence's draft adds to a step."""
        length = (
            self.num_speculative_tokens
            if self.mean_draft_length is None
            else self.mean_draft_length
        )
        return max(1, round(length))

    def drafts_at(self, decodes: int) -> bool:
        """Whether a step with `decodes` decoding sequences verifies drafts."""
        gate = self.disable_by_batch_size
        return decodes > 0 and (gate is None or decodes <= gate)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the profile and the plan's JSON."""
        return asdict(self)

    def describe(self) -> str:
        """One line for the console."""
        gate = self.disable_by_batch_size
        when = "always" if gate is None else f"while ≤ {gate} sequences decode"
        return (
            f"speculation: {self._drafts()} {when}, acceptance "
            f"{self.acceptance_rate:.0%}, mean accepted length {self.mean_accepted_length:.2f} "
            f"(measured over {self.requests} probe requests; acceptance is workload-specific)"
        )

    def _drafts(self) -> str:
        if self.mean_draft_length is None:
            return f"{self.num_speculative_tokens} draft tokens"
        return f"{self.mean_draft_length:.1f} of up to {self.num_speculative_tokens} draft tokens"


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def speculation_from_json(document: Any) -> Speculation | None:
    """Read what `Speculation.to_json` wrote (None stays None); PlanError otherwise."""
    if document is None:
        return None
    if not isinstance(document, dict):
        raise PlanError("the profile's speculation must be an object or null")
    try:
        return Speculation(**document)
    except TypeError as exc:
        raise PlanError(f"the profile's speculation is malformed: {exc}") from exc


def measured_speculation(
    num_speculative_tokens: int,
    disable_by_batch_size: int | None,
    drafts: float,
    draft_tokens: float,
    accepted: float,
    requests: int,
) -> Speculation:
    """Acceptance from counter growth over a probe; PlanError when nothing was drafted."""
    if drafts <= 0 or draft_tokens <= 0:
        raise PlanError(
            "the acceptance probe drafted nothing (no draft tokens counted); "
            "give prompts whose answers repeat their text (--acceptance-dataset)"
        )
    return Speculation(
        num_speculative_tokens=num_speculative_tokens,
        disable_by_batch_size=disable_by_batch_size,
        acceptance_rate=round(accepted / draft_tokens, 4),
        mean_accepted_length=round(1 + accepted / drafts, 4),
        requests=requests,
        mean_draft_length=round(min(max(draft_tokens / drafts, 1.0), num_speculative_tokens), 4),
    )
