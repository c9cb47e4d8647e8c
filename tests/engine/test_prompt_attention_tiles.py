"""A prompt's rows attended on bf16 products (attention_tiles.cpp: AMX tiles, else AVX-512
BF16's vdpbf16ps), where the host has them: against attention computed in float64 from the
same bf16-rounded queries, keys and values, and a row's bits the same whatever the
chunking, the rows beside it and the threads. On a host without either (AVX2), marked rows
take the float32 loops: the same bits as unmarked."""

from __future__ import annotations

import itertools

import pytest
import torch
from engine_helpers import needs_kernels

from inhouse.engine.kernels.quant import kv_row_values, kv_rows_int8

pytestmark = needs_kernels

HEADS, KV_HEADS, BLOCK = 6, 2, 16
CACHE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8]


def tiles_here(dim: int) -> bool:
    return bool(torch.ops.inhouse_cpu.prompt_attention_tiles(dim))


def attend(q, caches, tables, seqs, lens, window, prompt=None, torch_threads=True):
    return torch.ops.inhouse_cpu.paged_attention_rows(
        q, *caches, tables, seqs, lens, BLOCK, 0.125, window, torch_threads, prompt
    )


def setup(dim: int, cache_dtype: torch.dtype, seed: int = 0):
    """Two sequences' caches (120 and 70 positions, scattered blocks) and queries for them."""
    gen = torch.Generator().manual_seed(seed)
    caches = tuple(
        kv_rows_int8(x) if cache_dtype == torch.int8 else x.to(cache_dtype)
        for x in torch.randn(2, 16 * BLOCK, KV_HEADS, dim, generator=gen)
    )
    tables = torch.stack([torch.randperm(8, generator=gen), 8 + torch.randperm(8, generator=gen)])
    q = {s: torch.randn(n, HEADS, dim, generator=gen) for s, n in ((0, 120), (1, 70))}
    return caches, tables, q


def reference(q, caches, tables, s, n, window, bf16: bool):
    """Row at position n - 1 of sequence s in float64; with `bf16` its query, keys and values
    rounded to bf16 first, as the tiles take them."""
    rounded = (lambda t: t.bfloat16().double()) if bf16 else (lambda t: t.double())
    slots = torch.tensor([int(tables[s, t // BLOCK]) * BLOCK + t % BLOCK for t in range(n)])
    slots = slots[-window:] if window else slots
    k, v = (rounded(kv_row_values(c[slots])) for c in caches)
    k = k.repeat_interleave(HEADS // KV_HEADS, 1).transpose(0, 1)  # [heads, keys, dim]
    v = v.repeat_interleave(HEADS // KV_HEADS, 1).transpose(0, 1)
    scores = (rounded(q)[:, None, :] @ k.transpose(1, 2)) * 0.125
    return (scores.softmax(-1) @ v).reshape(-1)


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=["fp32", "fp16", "bf16", "int8"])
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("window", [0, 40])
def test_prompt_rows_match_a_float64_reference_and_keep_their_bits(window, dim, cache_dtype):
    caches, tables, q = setup(dim, cache_dtype, seed=dim + window)
    # sequence 0's prompt rows 0..119 in one call (with sequence 1's 70 beside)
    rows_q = torch.cat([q[0], q[1]])
    seqs = torch.tensor([0] * 120 + [1] * 70)
    lens = torch.cat([torch.arange(1, 121), torch.arange(1, 71)])
    marked = torch.ones(190, dtype=torch.bool)
    whole = attend(rows_q, caches, tables, seqs, lens, window, marked)
    # on the tiles: bf16's rounding of the weights (2^-9 each) bounds the gap; in the
    # float32 loops (no tiles here), float32's
    tiles = tiles_here(dim)
    tolerance = {"atol": 5e-3, "rtol": 1e-2} if tiles else {"atol": 1e-5, "rtol": 1e-5}
    for s, rows in ((0, (0, 1, 15, 16, 31, 32, 33, 77, 119)), (1, (0, 40, 69))):
        for i in rows:
            ref = reference(q[s][i], caches, tables, s, i + 1, window, tiles)
            torch.testing.assert_close(whole[120 * s + i].double(), ref, **tolerance)
    # chunked as a scheduler might chunk it, alone, on the pool: the same bits
    for cuts in ((0, 7, 23, 64, 120), (0, 1, 2, 50, 51, 120), (0, 120)):
        for a, b in itertools.pairwise(cuts):
            part = attend(
                q[0][a:b], caches, tables[:1], torch.zeros(b - a, dtype=torch.long),
                lens[a:b], window, torch.ones(b - a, dtype=torch.bool), torch_threads=False,
            )  # fmt: skip
            assert torch.equal(part, whole[a:b]), (cuts, a, b)
    # beside decode rows (unmarked: the float32 loops), which keep the loops' bits
    decodes = torch.randn(2, HEADS, dim)
    mixed = attend(
        torch.cat([decodes, q[0][30:50]]), caches, tables, torch.tensor([1, 0] + [0] * 20),
        torch.cat([torch.tensor([70, 120]), lens[30:50]]), window,
        torch.tensor([False, False] + [True] * 20),
    )  # fmt: skip
    assert torch.equal(mixed[2:], whole[30:50])
    loops = attend(decodes, caches, tables, torch.tensor([1, 0]), torch.tensor([70, 120]), window)
    assert torch.equal(mixed[:2], loops)
    unmarked = attend(rows_q, caches, tables, seqs, lens, window)
    if not tiles:
        assert torch.equal(whole, unmarked)  # no tiles: marked rows take the loops too


def test_bf16_products_are_used_where_the_host_has_avx512_bf16() -> None:
    """AMX bf16 tiles where granted, else vdpbf16ps: either needs AVX-512 BF16, which the
    kernels are built for only when the build is not capped below AVX-512."""
    from inhouse.engine.kernels.build import cpu_flags, load_kernels

    kernels = load_kernels()
    assert kernels is not None
    bf16 = kernels.isa.startswith("avx512") and "avx512_bf16" in cpu_flags()
    assert tiles_here(64) == bf16 and tiles_here(128) == bf16
    assert not tiles_here(48)  # a head dim the products do not take
