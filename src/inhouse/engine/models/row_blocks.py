"""Which row counts a bf16 product on this CPU may take and still give each row its bits.

oneDNN picks its bf16 matmul kernel by the number of rows, and kernels sum in different
orders, so a request's greedy tokens could depend on what it was batched with. Which
counts agree with one row at a time is a property of the CPU and the weight's shape: on
an AMX Xeon every count up to 32 does; emulating a Zen 4 (AVX-512 bf16, no AMX) a
down projection (K = 1536) parts from one row alone already at two rows.

Summation orders that differ change a float32 sum in its last bits, and the bf16 output
rounds most of that away: only about one output in 5,000 shows it. So a single random
batch proves nothing (the probe before this one said 16 where 2 parted). Each block size
is checked on enough rows for about a quarter of a million outputs, with inputs spread
over twelve binades, and a size is kept only if every output agrees. Products then run
their rows in blocks of the kept sizes only (see :func:`blocked_linear`), so every row
goes through a count whose bits were checked, and a row alone is its own block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BLOCK_SIZES = (32, 16, 8, 4, 2)  # candidates, largest first: binary splits of any count
PROBE_OUTPUTS = 2**18  # outputs compared per candidate: a part shows ~50 times in this


def invariant_row_blocks(
    weight: torch.Tensor, bias: torch.Tensor | None = None, outputs: int = PROBE_OUTPUTS
) -> tuple[int, ...]:
    """The row counts (largest first, always ending in 1) whose products by ``weight`` gave
    every probed row exactly the bits it gets alone."""
    out_features, in_features = weight.shape
    most = BLOCK_SIZES[0]
    rows = most * max(1, math.ceil(outputs / (most * out_features)))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, in_features, generator=generator)
    x = x * torch.exp2(torch.randint(-6, 7, x.shape, generator=generator).float())
    x = x.to(weight.dtype)
    alone = torch.cat([F.linear(row, weight, bias) for row in x.split(1)])
    kept = [
        size
        for size in BLOCK_SIZES
        if torch.equal(torch.cat([F.linear(b, weight, bias) for b in x.split(size)]), alone)
    ]
    return (*kept, 1)


def split_rows(rows: int, sizes: tuple[int, ...]) -> list[int]:
    """``rows`` as a sum of ``sizes`` (largest first, ending in 1), greedily."""
    parts: list[int] = []
    for size in sizes:
        count, rows = divmod(rows, size)
        parts += [size] * count
    return parts


def blocked_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, sizes: tuple[int, ...]
) -> torch.Tensor:
    """``F.linear`` with the rows of ``x`` multiplied in blocks of the checked ``sizes``."""
    if x.shape[0] in sizes:
        return F.linear(x, weight, bias)
    blocks = x.split(split_rows(x.shape[0], sizes))
    return torch.cat([F.linear(rows, weight, bias) for rows in blocks])


def describe_blocks(blocks: dict[tuple[int, ...], tuple[int, ...]]) -> str:
    """One clause for the start-up table: the row counts each projection shape runs in."""
    shapes = ", ".join(
        f"{out}x{inp}: {'/'.join(map(str, sizes))}" for (out, inp, *_), sizes in blocks.items()
    )
    return f"bf16 rows in counts checked to give each row its bits alone ({shapes})"
