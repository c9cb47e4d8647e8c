"""Weight-only block quantization for the C++ linears (layouts in ``cpu_kernels.cpp``).

Groups of 32 weights along the input dimension, as GGUF's Q8_0 and Q4_1:

- ``q8``: ``d = max|w| / 127``, ``q = round(w / d)``; 8.5 bits a weight with a float16
  scale in GGUF, 9 here (float32 scales).
- ``q4``: ``d = (max - min) / 15``, ``m = min``, ``q = round((w - m) / d)``; 5 bits a
  weight in GGUF, 6 here.

Quantizing weights that were dequantized from a GGUF Q8_0/Q4_1 tensor gives back that
tensor's own blocks (each block's extremes are exactly its codes 0 and 15, or ±127), up to
float rounding of the scales: a GGUF model's weights stay the file's weights.
:func:`dequantize` returns what the kernels multiply by, for reference runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
FORMATS = ("q8", "q4")


@dataclass(slots=True)
class QuantizedWeight:
    """One linear's weight ``[out, in]`` in format ``kind``; ``mins`` only for q4."""

    kind: str
    q: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    in_features: int

    @property
    def nbytes(self) -> int:
        extra = 0 if self.mins is None else self.mins.nbytes
        return self.q.nbytes + self.scales.nbytes + extra


def quantizable(in_features: int) -> bool:
    return in_features % GROUP == 0


def quantize(weight: torch.Tensor, kind: str) -> QuantizedWeight:
    """Quantize a ``[out, in]`` weight (``in`` a multiple of 32) by the C++ kernels, in one
    pass (the formulas above; the kernels must be loaded)."""
    if kind not in FORMATS:
        raise ValueError(f"unknown weight format {kind!r}; use {', '.join(FORMATS)}")
    in_features = weight.shape[1]
    if not quantizable(in_features):
        raise ValueError(f"input features {in_features} are not a multiple of {GROUP}")
    if kind == "q8":
        q, scales = torch.ops.inhouse_cpu.quantize_q8(weight)
        return QuantizedWeight(kind, q, scales, None, in_features)
    q, scales, mins = torch.ops.inhouse_cpu.quantize_q4(weight)
    return QuantizedWeight(kind, q, scales, mins, in_features)


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """The float32 ``[out, in]`` weight the kernels compute with."""
    out_features = weight.q.shape[0]
    groups = weight.in_features // GROUP
    if weight.kind == "q8":
        codes = weight.q.reshape(out_features, groups, GROUP).float()
        return (codes * weight.scales[..., None]).reshape(out_features, weight.in_features)
    packed = weight.q.reshape(out_features, groups, GROUP // 2)
    codes = torch.cat((packed & 0x0F, packed >> 4), dim=-1).float()
    assert weight.mins is not None
    w = codes * weight.scales[..., None] + weight.mins[..., None]
    return w.reshape(out_features, weight.in_features)


def dequantize_rows(weight: QuantizedWeight, rows: torch.Tensor) -> torch.Tensor:
    """Float32 rows ``[len(rows), in]`` of a q8 weight, as :func:`dequantize` gives them."""
    if weight.kind != "q8":
        raise ValueError(f"rows are looked up in q8 tables only, not {weight.kind}")
    codes = weight.q.index_select(0, rows).reshape(len(rows), -1, GROUP).float()
    scaled = codes * weight.scales.index_select(0, rows)[..., None]
    return scaled.reshape(len(rows), weight.in_features)


def linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` by the C++ kernel for the weight's format (float32 ``x``)."""
    ops = torch.ops.inhouse_cpu
    if weight.kind == "q8":
        return ops.linear_q8(x, weight.q, weight.scales, bias)
    return ops.linear_q4(x, weight.q, weight.scales, weight.mins, bias)
