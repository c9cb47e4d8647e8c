"""The int8 KV cache's attention against a reference of its own, not against the float16
cache's greedy tokens (which a 135M model's near-ties decide).

A float16 cache (SmolLM2-135M's attention shape: 9 heads over 3 KV heads of 64 features)
is written into the int8 cache by the kernels' own K/V write (``rope_write_kv`` with cos 1,
sin 0: the rows unrotated), which must give numpy's per-token, per-head quantization bit
for bit (d = max|x| / 127 in float32, codes round-half-even of x / d). The reference then
attends in float64 over the numpy codes times their scales; the kernel's output must be
within ``TOLERANCE`` of it for contexts of 16, 300 and 2,500 tokens, for a decode row and a
run of prefill rows. Key rows carry scales that differ from token to token (each row times
e^N(0, 0.5²)) and queries give peaked weights (the top key ~0.75), so a scale read for the
wrong key, or one percent off, moves the output by far more than the tolerance: the tests
below check that it does, for a key in each of the four lanes the AVX-512 block scores at
once. The AVX2 build (``INHOUSE_KERNELS_ISA=avx2``) runs in a subprocess on an AVX-512 host
and must give the native build's bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import avx2_build_outputs, needs_kernels

pytestmark = needs_kernels

HEADS, KV_HEADS, BLOCK, SCALE = 9, 3, 16, 0.125
CONTEXTS = (16, 300, 2500)
# 64: SmolLM2's head dim, the SIMD blocks' path; 40 (not a multiple of 16): the plain loop.
DIMS = (64, 40)
# Outputs are O(1) (values ~N(0, 1)). Measured: at most 5.7e-6 (2,500 keys, prefill rows), the
# same bits on AVX-512 and AVX2; one key's scale 1% off moved the decode row's output by
# 2.8e-4 (a key of weight 0.001) to 2.7e-2 (a key of weight 0.94).
TOLERANCE = 2e-5
PREFILL_ROWS = 80  # over the kernel's 64-row split: a long prompt's unsplit tiles


@dataclass(frozen=True)
class Case:
    """One sequence's caches and query rows: positions n - rows .. n - 1, the last a decode."""

    dim: int
    slots: np.ndarray  # [n] each position's cache slot, over shuffled blocks
    table: torch.Tensor  # [1, blocks]
    k_codes: np.ndarray  # [n, KV_HEADS, dim] int8, numpy's quantization of the float16 keys
    k_scales: np.ndarray  # [n, KV_HEADS] float32
    v_codes: np.ndarray
    v_scales: np.ndarray
    k_cache: torch.Tensor  # [slots, KV_HEADS, dim + 4] int8, written by the kernel
    v_cache: torch.Tensor
    q: np.ndarray  # [rows, HEADS, dim] float32
    lens: np.ndarray  # [rows] keys each row attends to


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token and head: d = max|x| / 127 (float32), codes round(x / d) (0 where d = 0)."""
    x = x.astype(np.float32)
    d = np.abs(x).max(-1, keepdims=True) / np.float32(127)
    safe = np.where(d > 0, d, np.float32(1))
    codes = np.where(d > 0, np.rint(x / safe), 0).clip(-127, 127).astype(np.int8)
    return codes, d[..., 0]


def cache_scales(cache: torch.Tensor, dim: int) -> torch.Tensor:
    """The float32 scales [slots, KV_HEADS] stored after an int8 cache's codes (a view)."""
    return cache[..., dim:].view(torch.float32)[..., 0]


@cache
def make_case(n: int, dim: int) -> Case:
    """n positions of float16 K and V written by the kernel into an int8 cache, and the
    numpy quantization of the same rows (built once per n and dim)."""
    rng = np.random.default_rng(n + dim)
    blocks = -(-n // BLOCK)
    order = rng.permutation(blocks)
    slots = order[np.arange(n) // BLOCK] * BLOCK + np.arange(n) % BLOCK
    spread = np.exp(rng.standard_normal((n, KV_HEADS, 1)) * 0.5)
    k16 = (rng.standard_normal((n, KV_HEADS, dim)) * spread).astype(np.float16)
    v16 = rng.standard_normal((n, KV_HEADS, dim)).astype(np.float16)
    qkv = np.zeros((n, HEADS + 2 * KV_HEADS, dim), np.float32)
    qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :] = k16, v16
    k_cache = torch.zeros(blocks * BLOCK, KV_HEADS, dim + 4, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    torch.ops.inhouse_cpu.rope_write_kv(
        torch.from_numpy(qkv), torch.ones(n, dim), torch.zeros(n, dim), k_cache, v_cache,
        torch.from_numpy(slots), HEADS,
    )  # fmt: skip
    rows = min(n, PREFILL_ROWS)
    q = (rng.standard_normal((rows, HEADS, dim)) * 3).astype(np.float32)
    return Case(
        dim, slots, torch.from_numpy(order[None].astype(np.int64)), *quantize_rows(k16),
        *quantize_rows(v16), k_cache, v_cache, q, np.arange(n - rows + 1, n + 1),
    )  # fmt: skip


def reference(case: Case, k_scales: np.ndarray | None = None, last: int = 0) -> np.ndarray:
    """Attention in float64 over the numpy codes times their scales (the key scales given,
    else the case's), for the case's rows or its ``last`` ones: [rows, HEADS, dim]."""
    scales = case.k_scales if k_scales is None else k_scales
    keys = case.k_codes.astype(np.float64) * scales[..., None]
    values = case.v_codes.astype(np.float64) * case.v_scales[..., None]
    q, lens = case.q[-last:], case.lens[-last:]
    out = np.empty(q.shape)
    for r, n in enumerate(lens):
        grouped = q[r].astype(np.float64).reshape(KV_HEADS, -1, case.dim)
        s = np.einsum("tkd,kgd->kgt", keys[:n], grouped) * SCALE
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out[r] = np.einsum("kgt,tkd->kgd", w, values[:n]).reshape(HEADS, case.dim)
    return out


def kernel(case: Case, decode: bool) -> np.ndarray:
    """The kernel's output for the case's last row alone (a decode) or all its rows."""
    q, lens = (case.q[-1:], case.lens[-1:]) if decode else (case.q, case.lens)
    out = torch.ops.inhouse_cpu.paged_attention_rows(
        torch.from_numpy(q), case.k_cache, case.v_cache, case.table,
        None if decode else torch.zeros(len(lens), dtype=torch.long),
        torch.from_numpy(lens), BLOCK, SCALE, 0,
    )  # fmt: skip
    return out.numpy().reshape(q.shape).astype(np.float64)


def kernel_outputs() -> dict[str, np.ndarray]:
    """Every case's decode and prefill outputs, by name (compared across builds)."""
    return {
        f"{n}-{dim}-{kind}": kernel(make_case(n, dim), kind == "decode")
        for n in CONTEXTS
        for dim in DIMS
        for kind in ("decode", "prefill")
    }


@pytest.mark.parametrize("n", CONTEXTS)
@pytest.mark.parametrize("dim", DIMS)
def test_the_kernels_int8_rows_are_numpys_quantization(n: int, dim: int) -> None:
    case = make_case(n, dim)
    for rows, codes, scales in (
        (case.k_cache, case.k_codes, case.k_scales),
        (case.v_cache, case.v_codes, case.v_scales),
    ):
        assert np.array_equal(rows[case.slots, :, :dim].numpy(), codes)
        assert np.array_equal(cache_scales(rows, dim)[case.slots].numpy(), scales)


@pytest.mark.parametrize("n", CONTEXTS)
@pytest.mark.parametrize("dim", DIMS)
def test_int8_attention_is_within_the_tolerance_of_the_reference(n: int, dim: int) -> None:
    case = make_case(n, dim)
    expected = reference(case)
    assert np.abs(kernel(case, decode=False) - expected).max() <= TOLERANCE
    assert np.abs(kernel(case, decode=True) - expected[-1:]).max() <= TOLERANCE


@pytest.mark.parametrize("lane", range(4))
def test_a_key_scale_one_percent_off_leaves_the_tolerance(lane: int) -> None:
    """The decode row's most attended key (of head 0) at a position in the given lane of the
    AVX-512 block's four keys has its stored scale times 1.01: the kernel's output leaves
    the reference's tolerance many times over, and meets the reference given that scale."""
    case = make_case(2500, 64)
    expected = reference(case, last=1)
    keys = case.k_codes[:, 0].astype(np.float64) * case.k_scales[:, 0, None]
    weights = keys @ case.q[-1, 0].astype(np.float64)
    position = lane + 4 * int(np.argmax(weights[lane::4]))
    broken_scales = case.k_scales.copy()
    broken_scales[position, 0] *= np.float32(1.01)
    stored = cache_scales(case.k_cache, 64)
    kept = stored[case.slots[position], 0].item()
    stored[case.slots[position], 0] = float(broken_scales[position, 0])
    try:
        got = kernel(case, decode=True)
    finally:
        stored[case.slots[position], 0] = kept
    assert np.abs(got - expected).max() > 10 * TOLERANCE
    assert np.abs(got - reference(case, broken_scales, last=1)).max() <= TOLERANCE


def test_the_avx2_build_gives_the_native_builds_bits(tmp_path: Path) -> None:
    """On an AVX-512 host the AVX2 build (what an AVX2-only host runs) in a subprocess: every
    output the same bits as this process's AVX-512 build, so within the tolerance too."""
    theirs, ours = avx2_build_outputs(Path(__file__).stem, tmp_path / "avx2.npz"), kernel_outputs()
    assert sorted(theirs) == sorted(ours)
    for name, out in ours.items():
        assert np.array_equal(theirs[name], out), name
