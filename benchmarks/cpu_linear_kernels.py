"""CPU matmul kernels for a decode step's weights: why `--quantization auto` is q8 on the
C++ kernels, and bf16 where the CPU has AMX.

A 30-layer stack of SmolLM2-135M's projection shapes (q/k/v fused, o, gate/up fused,
down; distinct weights per layer, so they stream from memory as in a real step) plus
the 49,152-row LM head, multiplied at M rows (1 = one stream decoding, 16 = a batch,
64 = a prompt chunk, 950 = a long prompt) by each kernel; prints the fastest step's ms,
GOP/s (2 ops a multiply-add: the figure to hold against the host's int8 peak) and the ratio
against the first kernel run. On an AMX host the inhouse kernels run twice: as served (16+
rows on the tiles) and with the tiles off (``use_amx(False)``: the VNNI loops, the same bits).

    .venv/bin/python benchmarks/cpu_linear_kernels.py [--steps 5] [--rows 1,16,64]
    .venv/bin/python benchmarks/cpu_linear_kernels.py --only inhouse --rows 64,950
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from inhouse.engine.kernels.build import load_kernels
from inhouse.engine.kernels.quant import linear, quantize

LAYERS = 30
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) per layer
HEAD = (49152, 576)

Prepare = Callable[[torch.Tensor], object]
Multiply = Callable[[torch.Tensor, object], torch.Tensor]


def _int8_dynamic(w: torch.Tensor) -> object:
    scale = w.abs().amax(1) / 127
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated; measured anyway
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None)


KERNELS: dict[str, tuple[Prepare, Multiply]] = {
    "MKL float32 F.linear": (lambda w: w, lambda x, w: F.linear(x, w)),
    "fbgemm fp16 weights": (
        lambda w: torch.ops.quantized.linear_prepack_fp16(w, None),
        lambda x, p: torch.ops.quantized.linear_dynamic_fp16(x, p),
    ),
    "fbgemm int8 dynamic": (
        _int8_dynamic,
        lambda x, p: torch.ops.quantized.linear_dynamic(x, p, True),
    ),
    "bf16 F.linear": (lambda w: w.bfloat16(), lambda x, w: F.linear(x.bfloat16(), w)),
}


def _vnni_only(x: torch.Tensor, w: object) -> torch.Tensor:
    torch.ops.inhouse_cpu.use_amx(False)
    try:
        return linear(x, w, None)
    finally:
        torch.ops.inhouse_cpu.use_amx(True)


_built = load_kernels()
if _built is not None:
    for kind in ("q8", "q4"):
        KERNELS[f"inhouse {kind} (C++)"] = (
            lambda w, kind=kind: quantize(w, kind),
            lambda x, w: linear(x, w, None),
        )
        if _built.isa == "avx512-amx":
            KERNELS[f"inhouse {kind} (no AMX)"] = (
                lambda w, kind=kind: quantize(w, kind),
                _vnni_only,
            )


def step_ms(rows: int, prepare: Prepare, multiply: Multiply, steps: int) -> float:
    weights = [torch.randn(*shape) * 0.02 for _ in range(LAYERS) for shape in SHAPES]
    weights.append(torch.randn(*HEAD) * 0.02)
    packed = [(w.shape[1], prepare(w)) for w in weights]
    inputs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in weights}}

    def step() -> None:
        for width, p in packed:
            multiply(inputs[width], p)

    step()
    times = []
    for _ in range(steps):  # the fastest step: a shared host's stalls only slow the others
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", default="1,16", help="activation rows, comma-separated")
    parser.add_argument("--only", default="", help="run the kernels whose name holds this")
    args = parser.parse_args()
    macs = LAYERS * sum(o * i for o, i in SHAPES) + HEAD[0] * HEAD[1]
    print(
        f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, "
        f"threads {torch.get_num_threads()}"
    )
    for rows in map(int, args.rows.split(",")):
        base = None
        for name, (prepare, multiply) in KERNELS.items():
            if args.only not in name:
                continue
            ms = step_ms(rows, prepare, multiply, args.steps)
            base = base or ms
            gops = 2 * rows * macs / ms / 1e6
            shown = f"{ms:8.1f} ms/step  {gops:6.1f} GOP/s  {base / ms:5.2f}x"
            print(f"M={rows:>3}  {name:<22} {shown}")


if __name__ == "__main__":
    main()
