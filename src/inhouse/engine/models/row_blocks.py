"""How many rows a bf16 product on this CPU may take at once and still give each row its bits.

oneDNN picks its bf16 matmul kernel by the number of rows, and kernels sum in different
orders: on AMX CPUs a product of up to 32 rows gives every row the bits it gets alone,
one of 33 or more does not. A request's greedy tokens would then depend on what it was
batched with. The blocking is a property of the shapes, not of the numbers, so one probe
with random rows per weight shape finds the largest block that agrees with one row at a
time; projections then run their rows in blocks of that size (see ``Linear.row_block``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MOST_ROWS = 32  # the largest block probed: beyond it the per-call overhead is already small


def invariant_row_block(
    weight: torch.Tensor, bias: torch.Tensor | None = None, most: int = MOST_ROWS
) -> int:
    """The largest ``m <= most`` such that a product of any 1..m rows by ``weight`` gives
    each row exactly the bits it gets alone (1 when even two rows part)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(most, weight.shape[1], generator=generator).to(weight.dtype)
    alone = torch.cat([F.linear(row, weight, bias) for row in x.split(1)])
    for rows in range(2, most + 1):
        if not torch.equal(F.linear(x[:rows], weight, bias), alone[:rows]):
            return rows - 1
    return most
