"""The adapter product on its own: the C++ kernel and the torch path against float64, and a
row's bits whatever rows and adapters share its call."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import needs_kernels

from inhouse.engine.lora.stack import AdapterRows, LoraStack, PartWeights

IN, OUT = 96, 88  # 88: the last block of 16 output columns is partial


def _stack(kernel: bool, ranks: list[list[int]], halves=torch.float32) -> LoraStack:
    """Slots with parts of ``ranks[slot]`` (two parts of 40 output rows each), their halves
    in ``halves``."""
    gen = torch.Generator().manual_seed(3)
    stack = LoraStack(len(ranks), 2 * 16, IN, OUT, torch.device("cpu"), kernel, halves)
    for slot, parts in enumerate(ranks):
        pairs = []
        for part, rank in enumerate(parts):
            if rank == 0:
                pairs.append((40 * part, None))
                continue
            a, b = torch.randn(rank, IN, generator=gen), torch.randn(40, rank, generator=gen)
            pairs.append((40 * part, PartWeights(a, b, 0.5 + slot)))
        stack.write(slot, pairs)
    return stack


def _reference(stack: LoraStack, out: torch.Tensor, x: torch.Tensor, slots: list[int]):
    expected = out.double().clone()
    for row, slot in enumerate(slots):
        if slot >= 0:
            a_t, b_t, scale = (h.double() for h in stack.low_rank_halves(slot))
            expected[row] += ((x[row].double() @ a_t) @ b_t) * scale
    return expected


@pytest.mark.parametrize("kernel", [pytest.param(True, marks=needs_kernels), False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("halves", [torch.float32, torch.bfloat16])
def test_the_product_matches_float64_for_mixed_rows(kernel, dtype, halves):
    stack = _stack(kernel, [[8, 0], [3, 16], [0, 5]], halves)
    slots = [0, -1, 2, 1, 1, 0, -1, 2, 1, 0, 0, 1, 2]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(len(slots), IN, generator=gen).to(dtype)
    out = torch.randn(len(slots), OUT, generator=gen).to(dtype)
    expected = _reference(stack, out, x, slots)
    rows = AdapterRows.of_entries(slots, [1] * len(slots), torch.device("cpu"))
    got = out.clone()
    stack.add_to(got, x, rows)
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got.double(), expected, rtol=tolerance, atol=tolerance)
    base_rows = [i for i, s in enumerate(slots) if s < 0]
    assert torch.equal(got[base_rows], out[base_rows])  # the base's rows untouched


@needs_kernels
@pytest.mark.parametrize("halves", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_what_shares_its_call(halves):
    stack = _stack(True, [[8, 8], [16, 16], [2, 0]], halves)
    gen = torch.Generator().manual_seed(9)
    slots = [1, 0, 1, 2, 1, 1, 1, 0, 2, 1]
    x = torch.randn(len(slots), IN, generator=gen)
    out = torch.randn(len(slots), OUT, generator=gen)
    together = out.clone()
    stack.add_to(together, x, AdapterRows.of_entries(slots, [1] * len(slots), x.device))
    for row, slot in enumerate(slots):
        alone = out[row : row + 1].clone()
        stack.add_to(alone, x[row : row + 1], AdapterRows.of_entries([slot], [1], x.device))
        assert torch.equal(alone[0], together[row]), row


@needs_kernels
def test_a_broken_scale_is_caught():
    """The reference is sharp enough to see one part's scaling off by 1 %."""
    stack = _stack(True, [[8, 8]])
    x, out = torch.randn(4, IN), torch.randn(4, OUT)
    expected = _reference(stack, out, x, [0] * 4)
    stack.scale[0, :40] *= 1.01
    got = out.clone()
    stack.add_to(got, x, AdapterRows.of_entries([0] * 4, [1] * 4, x.device))
    assert not torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-4)
