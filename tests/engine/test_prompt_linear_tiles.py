"""A quantized linear's prompt rows on AMX bf16 tiles (prompt_linear.cpp), where the host has
them: against float64 products of the same bf16-rounded rows and dequantized weights, each
row's bits its own at any row count and beside any rows, and the unmarked rows the int8
path's bits. On a host without the tiles, marked rows take the int8 path too."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import needs_kernels

from inhouse.engine.kernels.quant import GROUP, dequantize, linear, quantize

pytestmark = needs_kernels


def tiles_here() -> bool:
    return torch.ops.inhouse_cpu.bf16_linear_unit() == "amx"


def bf16_weight(weight) -> torch.Tensor:
    """The weight as the kernel rounds it to bf16: q8 d q, q4 fma(d, q, m) (one rounding)."""
    if weight.kind == "q8":
        return dequantize(weight).bfloat16()
    packed, scales, mins = weight.row_blocks()
    packed = packed.reshape(weight.out_features, -1, GROUP // 2)
    codes = torch.cat((packed & 0x0F, packed >> 4), dim=-1).double()
    once = (codes * scales.double()[..., None] + mins.double()[..., None]).float()
    return once.reshape(weight.out_features, weight.in_features).bfloat16()


@pytest.mark.parametrize("kind", ["q8", "q4"])
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (48, 1536)])
def test_prompt_rows_match_float64_and_keep_their_bits(kind, out_features, in_features):
    gen = torch.Generator().manual_seed(out_features)
    weight = quantize(torch.randn(out_features, in_features, generator=gen) * 0.05, kind)
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(70, in_features, generator=gen)
    every = torch.ones(70, dtype=torch.bool)
    got = linear(x, weight, bias, every)
    int8_path = linear(x, weight, bias)
    if not tiles_here():
        assert torch.equal(got, int8_path)
        return
    reference = x.bfloat16().double() @ bf16_weight(weight).double().T + bias.double()
    torch.testing.assert_close(got.double(), reference, atol=1e-5, rtol=1e-5)
    assert not torch.equal(got, int8_path)  # the tiles' path, not the int8 one
    for a, b in ((0, 1), (5, 21), (16, 48), (33, 70)):  # alone, across tile edges
        assert torch.equal(linear(x[a:b], weight, bias, every[a:b]), got[a:b]), (a, b)
    # a step's mix: marked rows the tiles' bits, the others the int8 path's
    marked = torch.rand(70, generator=gen) < 0.5
    mixed = linear(x, weight, bias, marked)
    assert torch.equal(mixed[marked], got[marked])
    assert torch.equal(mixed[~marked], linear(x[~marked], weight, bias))
