"""Byte sizes: parse what users type, print binary (GiB) and decimal (GB) units explicitly.

GPU memory is sold in binary units even where the label says "GB" (an RTX 4090's
"24 GB" is 24 GiB: nvidia-smi shows 24,564 MiB), while weight files and bandwidth
are decimal. The seeds mix the two; we always name the unit we print.
"""

from __future__ import annotations

import re

from inhouse.plan.errors import PlanError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GB = 1000**3

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": KIB,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MIB,
    "g": GB,
    "gb": GB,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Parse "24GiB", "24 GB", "7208MiB" or a plain byte count into bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise PlanError(
            f"cannot read {text!r} as a size; write it like 24GiB, 80GB, 512MiB or a byte count"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def binary(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number ≥ 1: '14.96 GiB', '128 KiB'."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}".replace(".00 ", " ")
    return f"{n:,.0f} B"


def decimal(n: float) -> str:
    """Bytes in decimal gigabytes, or megabytes below one GB: '16.06 GB', '96.58 MB'."""
    return f"{n / GB:,.2f} GB" if abs(n) >= GB else f"{n / 1000**2:,.2f} MB"


def both(n: float) -> str:
    """Bytes in both conventions, decimal first: '16.06 GB = 14.96 GiB'."""
    return f"{decimal(n)} = {binary(n)}"


def count(n: float) -> str:
    """A parameter count: '8.03 B', '134.5 M'."""
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.1f} M"


def milliseconds(seconds: float) -> str:
    """Seconds as milliseconds: whole ones with thousands separators, one decimal below 10."""
    return f"{seconds * 1000:,.0f}" if seconds >= 0.01 else f"{seconds * 1000:.1f}"
