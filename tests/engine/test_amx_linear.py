"""The q8/q4 linears on AMX tiles give the VNNI loops' bits (``kernels/amx_linear.cpp``).

Both paths find each group's exact int32 dot product and fold it into the row's sum in
the same float order, so their outputs must be equal bit for bit, which keeps batch and
chunking invariance whichever path a pass takes. Compared in one process by turning the
tiles off (``use_amx``); skipped where this host cannot run them.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import needs_kernels

from inhouse.engine.kernels.build import load_kernels
from inhouse.engine.kernels.quant import linear, quantize


def _amx_host() -> bool:
    kernels = load_kernels()
    return kernels is not None and kernels.isa == "avx512-amx"


needs_amx = pytest.mark.skipif(
    not _amx_host(),
    reason="no AMX int8 tiles here (CPU flags amx_tile/amx_int8, or Linux's grant): "
    "the VNNI loops run every pass",
)


@pytest.fixture
def amx_and_vnni():
    """Runs a linear with the tiles on, then off; the tiles are on again afterwards."""
    ops = torch.ops.inhouse_cpu

    def both(x, weight, bias):
        assert ops.use_amx(True)
        on = linear(x, weight, bias)
        assert not ops.use_amx(False)
        return on, linear(x, weight, bias)

    yield both
    ops.use_amx(True)


@needs_kernels
@needs_amx
@pytest.mark.parametrize("kind", ["q8", "q4"])
def test_amx_linear_gives_the_vnni_bits_on_random_shapes(kind: str, amx_and_vnni) -> None:
    rng = random.Random(47)
    torch.manual_seed(47)
    for trial in range(12):
        rows, k, n = rng.randint(1, 300), 32 * rng.randint(1, 48), 16 * rng.randint(1, 24)
        weight = quantize(torch.randn(n, k) * 0.05, kind)
        x = torch.randn(rows, k) * rng.choice([0.01, 1.0, 30.0])
        bias = torch.randn(n) if trial % 2 else None
        on, off = amx_and_vnni(x, weight, bias)
        assert torch.equal(on.view(torch.int32), off.view(torch.int32)), (rows, k, n)


@needs_kernels
@needs_amx
def test_rows_of_zeros_and_an_odd_tile_count_keep_the_bits(amx_and_vnni) -> None:
    """Zero rows (scale 0: the tail's padding looks the same) and 8-row tiles in an odd
    number (the tiles take 16 outputs at a time; such a linear stays on VNNI)."""
    torch.manual_seed(3)
    for n in (24, 48):
        weight = quantize(torch.randn(n, 96), "q4")
        x = torch.randn(37, 96)
        x[5] = 0
        on, off = amx_and_vnni(x, weight, None)
        assert torch.equal(on.view(torch.int32), off.view(torch.int32))
