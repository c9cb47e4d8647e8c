"""The planner's one error type, carrying one sentence for the user."""

from __future__ import annotations


class PlanError(ValueError):
    """Bad input: a missing file, malformed JSON, an unknown name, an impossible option."""
