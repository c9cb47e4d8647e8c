"""The pieces that make a request's bits independent of its batch, checked bit for bit.

bf16 projections run on AMX bf16 tiles, one order at any row count (``test_bf16_tiles.py``),
or where a host has none their rows in the block sizes :func:`invariant_row_blocks` keeps
(oneDNN's bf16 kernels change summation order with the row count), and on a CPU with the kernels
built every query row is attended by the C++ kernel on its own, so a prefill chunked
beside other sequences sums each query exactly as the whole prompt alone does (torch's
SDPA does not: where its flash split falls moves with the padding and, under AVX2, with
the number of queries). The engine-level check (sixteen requests together equal each
alone) is in ``test_engine_smollm2.py``.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import needs_kernels

from inhouse.engine.attention import build_attention_metadata, paged_attention
from inhouse.engine.kernels.build import load_kernels
from inhouse.engine.models.llama import Linear
from inhouse.engine.models.row_blocks import BLOCK_SIZES, invariant_row_blocks, split_rows

CPU = torch.device("cpu")
BF16 = torch.bfloat16


def test_bf16_projection_rows_equal_each_row_alone_in_the_probed_blocks():
    generator = torch.Generator().manual_seed(1)
    linear = Linear(1536, 576, bias=True, like={"dtype": BF16, "device": CPU})
    linear.weight.data = torch.randn(576, 1536, generator=generator).to(BF16)
    linear.bias.data = torch.randn(576, generator=generator).to(BF16)
    linear.row_blocks = invariant_row_blocks(linear.weight, linear.bias)
    assert linear.row_blocks[-1] == 1 and set(linear.row_blocks) <= {*BLOCK_SIZES, 1}
    x = torch.randn(300, 1536, generator=generator)
    x = (x * torch.exp2(torch.randint(-6, 7, x.shape, generator=generator).float())).to(BF16)
    alone = torch.cat([linear(row) for row in x.split(1)])
    for rows in (2, 3, 17, 31, 33, 64, 100, 300):
        for start in (0, 1, 7):
            got = linear(x[start : start + rows])
            assert torch.equal(got, alone[start : start + rows]), (rows, start)


def test_bundled_bf16_model_puts_every_projection_on_tiles_or_in_blocks(bundled_model_bf16):
    """On the kernels' bf16 unit where the host has one (``test_bf16_tiles.py``), else in
    blocks."""
    model = bundled_model_bf16.model
    projections = [m for m in model.modules() if isinstance(m, Linear)]  # the LM head tied
    tiles = load_kernels() is not None and bool(torch.ops.inhouse_cpu.bf16_linear_unit())
    assert projections and model.bf16_tiles == tiles
    for p in projections:
        assert p.tiles is not None if tiles else p.row_blocks[-1] == 1


def test_rows_split_into_the_checked_sizes_only():
    assert split_rows(1, (32, 16, 1)) == [1]
    assert split_rows(53, (32, 16, 1)) == [32, 16, 1, 1, 1, 1, 1]
    assert split_rows(5, (1,)) == [1] * 5
    assert sum(split_rows(1000, (*BLOCK_SIZES, 1))) == 1000


def test_row_blocks_keep_no_size_whose_rows_part():
    """float32's MKL gemv (one row) and gemm (two or more) sum in other orders: no block
    size survives the probe, and every row is multiplied alone."""
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(576, 576, generator=generator)
    x = torch.randn(2, 576, generator=generator)
    alone = torch.cat([F.linear(row, weight) for row in x.split(1)])
    if torch.equal(F.linear(x, weight), alone):
        pytest.skip("this CPU's float32 gemv and gemm agree on these rows")
    assert invariant_row_blocks(weight) == (1,)


def _paged_cache(slots: int, kv_heads: int, head_dim: int, seed: int, dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(slots, kv_heads, head_dim, generator=generator).to(dtype)


@needs_kernels
@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [(torch.float32, torch.float16), (torch.float32, torch.float32), (BF16, BF16)],
    ids=["fp32-fp16-cache", "fp32", "bf16"],
)
def test_prefill_attention_is_the_same_whole_or_in_chunks_beside_others(dtype, cache_dtype):
    """A 600-token prompt attended whole and alone, then in chunks of 100, each beside
    another prefill and a decode: every query row has the same bits."""
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    length, other_len = 600, 230
    blocks = list(range(1, 64))
    random.Random(3).shuffle(blocks)
    table, other_table, third_table = blocks[:38], blocks[38:53], blocks[53:63]
    k_cache = _paged_cache(64 * block_size, kv_heads, head_dim, 4, cache_dtype)
    v_cache = _paged_cache(64 * block_size, kv_heads, head_dim, 5, cache_dtype)
    generator = torch.Generator().manual_seed(6)
    q = torch.randn(length, heads, head_dim, generator=generator).to(dtype)
    q_others = torch.randn(38, heads, head_dim, generator=generator).to(dtype)
    scale = head_dim**-0.5

    def attend(computed, counts, tables, queries):
        meta, _ = build_attention_metadata(
            computed, counts, tables, block_size, heads // kv_heads, CPU, row_kernel=True
        )
        return paged_attention(queries, k_cache, v_cache, meta, scale)

    alone = attend([0], [length], [table], q)
    for start in range(0, length, 100):
        n = min(100, length - start)
        computed, counts = [start, other_len - 1, 120], [n, 1, 37]
        tables = [table, other_table, third_table]
        rows = attend(computed, counts, tables, torch.cat((q[start : start + n], q_others)))
        assert torch.equal(rows[:n], alone[start : start + n]), start
