"""The adapter product on its own: the C++ kernel and the torch path against float64, and a
row's bits whatever rows and adapters share its call."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import needs_kernels

from inhouse.engine.lora.stack import AdapterRows, LoraStack, PartWeights

IN, OUT = 96, 88  # 88: the last block of 16 output columns is partial
# Two parts: the second starting on a block (each block holds its own part's rank rows), or
# inside one (each block holds every part's).
LAYOUTS = {"blocks-own-part": [48, 40], "blocks-every-part": [40, 48]}


class Adapters:
    """A stack of slots with parts of ``ranks[slot]`` (0: the part not adapted), and the
    pairs it was written from, rounded to its halves' dtype where that is a float (int8
    halves are codes the stack makes): the reference's inputs."""

    def __init__(self, kernel: bool, ranks: list[list[int]], halves=torch.float32,
                 parts: list[int] = LAYOUTS["blocks-own-part"]) -> None:  # fmt: skip
        gen = torch.Generator().manual_seed(3)
        rounded = halves if halves.is_floating_point else torch.float32
        self.stack = LoraStack(len(ranks), 16, parts, IN, torch.device("cpu"), kernel, halves)
        self.pairs: list[list[tuple[int, PartWeights]]] = []
        for slot, slot_ranks in enumerate(ranks):
            written, kept = [], []
            for part, rank in enumerate(slot_ranks):
                if rank == 0:
                    written.append(None)
                    continue
                a = torch.randn(rank, IN, generator=gen).to(rounded).float()
                b = torch.randn(parts[part], rank, generator=gen).to(rounded).float()
                written.append(PartWeights(a, b, 0.5 + slot))
                kept.append((sum(parts[:part]), written[-1]))
            self.stack.write(slot, written)
            self.pairs.append(kept)

    def reference(self, out: torch.Tensor, x: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """In float64, part by part from the pairs themselves."""
        expected = out.double().clone()
        for row, slot in enumerate(slots):
            for start, pair in self.pairs[slot] if slot >= 0 else []:
                low = x[row].double() @ pair.a.double().T
                expected[row, start : start + pair.b.shape[0]] += (
                    low @ pair.b.double().T
                ) * pair.scaling
        return expected


@pytest.mark.parametrize("kernel", [pytest.param(True, marks=needs_kernels), False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("halves", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("parts", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_the_product_matches_float64_for_mixed_rows(kernel, dtype, halves, parts):
    adapters = Adapters(kernel, [[8, 0], [3, 16], [0, 5]], halves, parts)
    stack = adapters.stack
    slots = [0, -1, 2, 1, 1, 0, -1, 2, 1, 0, 0, 1, 2]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(len(slots), IN, generator=gen).to(dtype)
    out = torch.randn(len(slots), OUT, generator=gen).to(dtype)
    expected = adapters.reference(out, x, slots)
    rows = AdapterRows.of_entries(slots, [1] * len(slots), torch.device("cpu"))
    got = out.clone()
    stack.add_to(got, x, rows)
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    if halves == torch.int8:  # codes of 8 bits a column: within 1 % of the largest delta
        largest = (expected - out.double()).abs().max()
        assert (got.double() - expected).abs().max() <= 0.01 * largest
    else:
        assert torch.allclose(got.double(), expected, rtol=tolerance, atol=tolerance)
    base_rows = [i for i, s in enumerate(slots) if s < 0]
    assert torch.equal(got[base_rows], out[base_rows])  # the base's rows untouched


@needs_kernels
@pytest.mark.parametrize("halves", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("parts", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_a_rows_bits_do_not_depend_on_what_shares_its_call(halves, parts):
    stack = Adapters(True, [[8, 8], [16, 16], [2, 0]], halves, parts).stack
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
@pytest.mark.parametrize("parts", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_a_broken_scale_is_caught(parts):
    """The reference is sharp enough to see one part's scaling off by 1 %."""
    adapters = Adapters(True, [[8, 8]], parts=parts)
    stack = adapters.stack
    x, out = torch.randn(4, IN), torch.randn(4, OUT)
    expected = adapters.reference(out, x, [0] * 4)
    stack.scale[0, :40] *= 1.01
    got = out.clone()
    stack.add_to(got, x, AdapterRows.of_entries([0] * 4, [1] * 4, x.device))
    assert not torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-4)
