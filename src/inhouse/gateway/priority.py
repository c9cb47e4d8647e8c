"""Priority classes: `interactive` before `default` before `batch`.

A key has a class; a request may ask for a lower one (never a higher one) in its body's
`priority`: vLLM's integer (lower is sooner) or a class name. The effective class orders
the gateway's queue and travels upstream as vLLM's `priority` integer (`VLLM_PRIORITY`)."""

from __future__ import annotations

from typing import Any

CLASSES = ("interactive", "default", "batch")  # soonest first
DEFAULT_CLASS = "default"
VLLM_PRIORITY = {"interactive": -1, "default": 0, "batch": 1}
# A body's `priority` integer is bounded before use (vLLM's field is a plain int).
PRIORITY_BOUND = 2**31 - 1


class BadPriority(ValueError):
    """A body's `priority` is neither a bounded integer nor a class name (answered 400)."""


def rank(priority: str) -> int:
    """Position in the queue order: 0 for interactive, 2 for batch."""
    return CLASSES.index(priority)


def check_class(value: str) -> str:
    """`value` when it names a class, else ValueError naming the classes."""
    if value not in CLASSES:
        raise ValueError(f"priority must be one of {', '.join(CLASSES)}, got {value!r}")
    return value


def effective_class(key_class: str, body: dict[str, Any]) -> str:
    """The class a request runs at: what its body's `priority` asks, clamped so that it is
    never sooner than its key's class; BadPriority (400) for a value that is neither an
    integer within `PRIORITY_BOUND` nor a class name."""
    asked = requested_class(body.get("priority"))
    if asked is None:
        return key_class
    return CLASSES[max(rank(key_class), rank(asked))]


def requested_class(value: Any) -> str | None:
    """The class a body's `priority` names: an integer maps to the nearest class (below 0
    interactive, 0 default, above 0 batch), a class name to itself; None when absent."""
    if value is None:
        return None
    if isinstance(value, str) and value in CLASSES:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > PRIORITY_BOUND:
        raise BadPriority(
            f"'priority' must be an integer (|priority| <= {PRIORITY_BOUND}; lower is sooner)"
            f" or one of {', '.join(CLASSES)}"
        )
    return "interactive" if value < 0 else "default" if value == 0 else "batch"
