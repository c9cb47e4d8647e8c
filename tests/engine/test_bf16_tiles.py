"""``--dtype bfloat16`` on the C++ kernels: its products on AMX bf16 tiles (or, on an
AVX-512 BF16 CPU without them, on ``vdpbf16ps`` chains in the same weight layout), its
rotary and norms fused, each checked against an independent reference.

The tiles sum in an order of the hardware's own, so a row alone (a decode) goes through
the same tile products as a thousand; a chain is each row's own (``kernels/bf16_linear.cpp``).
Either way every row count must give every row the bits it gets alone, and float64
arithmetic bounds the sums. Skipped where this host has neither unit (the AVX2 build); the
row-block path those hosts take is ``test_batch_invariance.py``'s. The fused rotary and
norm run everywhere the kernels build, against the eager bf16 modules they replace.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import needs_kernels

from inhouse.engine.kernels.build import load_kernels
from inhouse.engine.models.llama import Linear, _rotate

BF16 = torch.bfloat16


def _tiles() -> bool:
    return load_kernels() is not None and bool(torch.ops.inhouse_cpu.bf16_linear_unit())


needs_tiles = pytest.mark.skipif(
    not _tiles(), reason="no bf16 unit here (AMX tiles or AVX-512 BF16): row blocks run"
)


def _spread(rows: int, features: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 values over twelve binades, where a changed summation order shows."""
    x = torch.randn(rows, features, generator=generator)
    return (x * torch.exp2(torch.randint(-6, 7, x.shape, generator=generator).float())).to(BF16)


@needs_kernels
@needs_tiles
@pytest.mark.parametrize(("out_features", "in_features"), [(576, 1536), (960, 576), (48, 32)])
def test_every_row_count_gives_each_row_its_bits_alone_within_bf16_of_float64(
    out_features: int, in_features: int
) -> None:
    generator = torch.Generator().manual_seed(3)
    linear = Linear(in_features, out_features, bias=True, like={"dtype": BF16, "device": "cpu"})
    weight = _spread(out_features, in_features, generator) * 0.01
    bias = torch.randn(out_features, generator=generator).to(BF16)
    linear.weight.data, linear.bias.data = weight.clone(), bias
    linear.pack_bf16_tiles()
    assert linear.weight is None and linear.tiles is not None
    x = _spread(300, in_features, generator)
    alone = torch.cat([linear(row) for row in x.split(1)])
    for rows in (2, 3, 15, 16, 17, 31, 32, 33, 64, 100, 300):
        for start in (0, 1, 7):
            got = linear(x[start : start + rows])
            assert torch.equal(got, alone[start : start + rows]), (rows, start)
    exact = x.double() @ weight.double().T + bias.double()
    # float32 sums of exact products, then one bf16 rounding: within 2^-8 of each output,
    # plus the float32 sum's own error over the row's magnitudes
    bound = exact.abs() * 2**-8 + (x.double().abs() @ weight.double().abs().T) * 2**-20
    assert ((alone.double() - exact).abs() <= bound).all()
    assert linear(x[:0]).shape == (0, out_features)


@needs_kernels
@needs_tiles
def test_the_tiles_refuse_shapes_they_cannot_hold_with_a_clear_error() -> None:
    ops = torch.ops.inhouse_cpu
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.pack_bf16(torch.zeros(24, 64, dtype=BF16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.pack_bf16(torch.zeros(32, 64))
    packed = ops.pack_bf16(torch.zeros(32, 64, dtype=BF16))
    with pytest.raises(RuntimeError, match="in features"):
        ops.linear_bf16(torch.zeros(2, 32, dtype=BF16), packed, None)


@needs_kernels
@pytest.mark.parametrize("cache_dtype", [BF16, torch.float16], ids=["bf16", "fp16"])
def test_fused_bf16_rotary_and_kv_write_equal_the_eager_ops(cache_dtype) -> None:
    generator = torch.Generator().manual_seed(4)
    heads, kv_heads, dim, tokens = 9, 3, 64, 5
    qkv = _spread(tokens * (heads + 2 * kv_heads), dim, generator).view(tokens, -1, dim)
    angles = torch.rand(tokens, dim, generator=generator) * 40
    cos, sin = angles.cos().to(BF16), angles.sin().to(BF16)
    k_cache = torch.zeros(16, kv_heads, dim, dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([9, 2, 14, 0, 5])
    q = torch.ops.inhouse_cpu.rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads)
    rotated = _rotate(qkv[:, : heads + kv_heads], cos[:, None], sin[:, None])
    assert q.dtype == BF16 and torch.equal(q, rotated[:, :heads])
    assert torch.equal(k_cache[slots], rotated[:, heads:].to(cache_dtype))
    assert torch.equal(v_cache[slots], qkv[:, heads + kv_heads :].to(cache_dtype))


@needs_kernels
def test_fused_bf16_add_and_norm_round_as_the_eager_module() -> None:
    generator = torch.Generator().manual_seed(5)
    residual, delta = _spread(64, 576, generator), _spread(64, 576, generator)
    weight = torch.randn(576, generator=generator).to(BF16)
    stream = residual + delta
    eager = weight * F.rms_norm(stream.float(), (576,), None, 1e-5).to(BF16)
    fused = torch.ops.inhouse_cpu.add_rms_norm(residual, delta, weight, 1e-5)
    assert torch.equal(residual, stream)  # added in place, rounded as a bf16 add
    # the mean square may differ from torch's in its last bit (its own summation order)
    differ = (fused != eager).sum().item()
    assert differ <= fused.numel() // 1000, differ
    torch.testing.assert_close(fused, eager, atol=0, rtol=2**-7)
