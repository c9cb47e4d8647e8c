"""Weight-only block quantization for the C++ linears (layouts in ``quant_linear.cpp``).

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
TILE = 8  # output rows a kernel tile holds (``kTile`` in quant_layout.h)
FORMATS = ("q8", "q4")


@dataclass(slots=True)
class QuantizedWeight:
    """One linear's weight ``[out, in]`` in format ``kind``, in the kernels' 8-row tiles:
    ``q`` ``[out/8, in/32, 256]`` int8 (q8) or ``[out/8, in/32, 128]`` uint8 (q4),
    ``scales`` and (q4 only) ``mins`` ``[out/8, in/32, 8]``."""

    kind: str
    q: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    in_features: int

    @property
    def nbytes(self) -> int:
        extra = 0 if self.mins is None else self.mins.nbytes
        return self.q.nbytes + self.scales.nbytes + extra

    @property
    def out_features(self) -> int:
        return self.q.shape[0] * TILE

    def row_blocks(self) -> tuple[torch.Tensor, ...]:
        """The blocks row by row: codes ``[out, in]`` (q4 packed two a byte as GGUF's Q4_1,
        byte j of a group holding codes j and j + 16: ``[out, in/2]``), scales (, mins)
        ``[out, in/32]``."""
        scales = _untile_scales(self.scales)
        if self.kind == "q8":
            return _untile_q8(self.q), scales
        assert self.mins is not None
        return _untile_q4(self.q), scales, _untile_scales(self.mins)


def quantizable(out_features: int, in_features: int) -> bool:
    """Whether a weight fits the kernels' blocks: whole groups and whole tiles."""
    return in_features % GROUP == 0 and out_features % TILE == 0


def quantize(weight: torch.Tensor, kind: str) -> QuantizedWeight:
    """Quantize a ``[out, in]`` weight (``in`` a multiple of 32, ``out`` of 8) into tiles
    by the C++ kernels in one pass (the formulas above; the kernels must be loaded)."""
    if kind not in FORMATS:
        raise ValueError(f"unknown weight format {kind!r}; use {', '.join(FORMATS)}")
    out_features, in_features = weight.shape
    if not quantizable(out_features, in_features):
        raise ValueError(
            f"a {out_features}x{in_features} weight is not whole {TILE}-row tiles of "
            f"{GROUP}-weight groups"
        )
    if kind == "q8":
        q, scales = torch.ops.inhouse_cpu.quantize_q8(weight)
        return QuantizedWeight(kind, q, scales, None, in_features)
    q, scales, mins = torch.ops.inhouse_cpu.quantize_q4(weight)
    return QuantizedWeight(kind, q, scales, mins, in_features)


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """The float32 ``[out, in]`` weight the kernels compute with."""
    out_features, groups = weight.out_features, weight.in_features // GROUP
    if weight.kind == "q8":
        codes, scales = weight.row_blocks()
        codes = codes.reshape(out_features, groups, GROUP).float()
        return (codes * scales[..., None]).reshape(out_features, weight.in_features)
    packed, scales, mins = weight.row_blocks()
    packed = packed.reshape(out_features, groups, GROUP // 2)
    codes = torch.cat((packed & 0x0F, packed >> 4), dim=-1).float()
    w = codes * scales[..., None] + mins[..., None]
    return w.reshape(out_features, weight.in_features)


def dequantize_rows(weight: QuantizedWeight, rows: torch.Tensor) -> torch.Tensor:
    """Float32 rows ``[len(rows), in]`` of a q8 weight, as :func:`dequantize` gives them."""
    if weight.kind != "q8":
        raise ValueError(f"rows are looked up in q8 tables only, not {weight.kind}")
    tiles, groups = weight.q.shape[:2]
    tile, row = rows // TILE, rows % TILE
    codes = weight.q.view(tiles, groups, GROUP // 4, TILE, 4)[tile, :, :, row, :]
    scaled = (
        codes.reshape(len(rows), groups, GROUP).float() * weight.scales[tile, :, row][..., None]
    )
    return scaled.reshape(len(rows), weight.in_features)


KV_INT8_SCALE_BYTES = 4  # an int8 KV row's float scale, after its codes (kQ8Scale)


def kv_rows_int8(x: torch.Tensor) -> torch.Tensor:
    """Rows ``[..., D]`` as the int8 KV cache holds them ``[..., D + 4]``: codes round(x / d),
    d = max|x| / 127 (codes 0 for an all-zero row), then d's four bytes (the kernels'
    store_q8_row, for reference runs and benchmarks)."""
    d = x.float().abs().amax(-1, keepdim=True) / 127
    codes = torch.where(d > 0, x / d, 0).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([codes, d.contiguous().view(torch.int8)], -1).contiguous()


def kv_row_values(rows: torch.Tensor) -> torch.Tensor:
    """The float values KV cache rows hold: an int8 row's codes times its scale."""
    if rows.dtype != torch.int8:
        return rows.float()
    codes, scale = rows.split([rows.shape[-1] - KV_INT8_SCALE_BYTES, KV_INT8_SCALE_BYTES], -1)
    return codes.float() * scale.contiguous().view(torch.float32)


def linear(
    x: torch.Tensor,
    weight: QuantizedWeight,
    bias: torch.Tensor | None,
    prompt_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` by the C++ kernel for the weight's format (float32 ``x``); the
    rows ``prompt_rows`` marks (a prompt's own) on AMX bf16 tiles where the host has them."""
    ops = torch.ops.inhouse_cpu
    if weight.kind == "q8":
        return ops.linear_q8(x, weight.q, weight.scales, bias, prompt_rows)
    return ops.linear_q4(x, weight.q, weight.scales, weight.mins, bias, prompt_rows)


# The tile layouts of quant_linear.cpp (quantize_q8/quantize_q4 write them), read back row
# by row for reference runs. q8, per tile and group: quad j (k = 4j + i) of row r
# at byte 32j + 4r + i. q4, per tile and group: pair p, rows r = 4h + s, byte 32p + 16h +
# 4s + i with k = 8p + i in its low nibble and k = 8p + 4 + i in its high nibble.


def _untile_scales(scales: torch.Tensor) -> torch.Tensor:
    tiles, groups, _ = scales.shape
    return scales.transpose(1, 2).reshape(tiles * TILE, groups)


def _untile_q8(q: torch.Tensor) -> torch.Tensor:
    tiles, groups, _ = q.shape
    by_row = q.view(tiles, groups, GROUP // 4, TILE, 4).permute(0, 3, 1, 2, 4)
    return by_row.reshape(tiles * TILE, groups * GROUP)


def _untile_q4(q: torch.Tensor) -> torch.Tensor:
    tiles, groups, _ = q.shape
    pairs = q.view(tiles, groups, 4, 2, 4, 4)  # [tile, group, p, h, s, i]
    split = torch.stack((pairs & 0x0F, pairs >> 4), dim=3)  # [tile, group, p, 2, h, s, i]
    codes = split.permute(0, 4, 5, 1, 2, 3, 6).reshape(tiles * TILE, groups, GROUP)
    return (codes[..., :16] | (codes[..., 16:] << 4)).reshape(tiles * TILE, groups * GROUP // 2)
