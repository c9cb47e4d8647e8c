"""Durations as people type them ("30d", "12h") and as OpenAI prints them ("6m0s")."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "5m", "12h", "30d", "1w" or "250ms"."""
    match = _PATTERN.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 5m, 12h, 30d, 1w)")
    value, unit = match.groups()
    return float(value) * _UNITS[unit or "s"]


def format_reset(seconds: float) -> str:
    """OpenAI's `x-ratelimit-reset-*` spelling: "17ms", "1.5s", "6m0s", "1h2m3s"."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{round(seconds * 1000)}ms"
    whole_minutes, rest = divmod(seconds, 60.0)
    hours, minutes = divmod(int(whole_minutes), 60)
    secs = f"{rest:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
