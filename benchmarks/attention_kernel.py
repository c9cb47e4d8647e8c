"""One layer's paged attention on the C++ kernel at SmolLM2-135M's shapes (9 query heads
over 3 KV heads of 64 features, a float16 cache, or another with ``--dtype``; ``int8`` is
``--kv-cache-dtype int8``'s rows): a decode row at several context lengths
and a whole prompt's prefill, in ms and GFLOP/s (2 flops a multiply-add, q.k and p.v).

``--layers 30`` times the decode rows over a step's 30 distinct caches, so their keys come
from memory as in a real step (one cache stays in the CPU's caches). ``--draft-rows 3,17``
times a speculative step's rows of one sequence the same way (all 30 layers). Prints one
line per case, to compare two commits run alternately on the same host:

    for i in 1 2 3; do for t in A B; do PYTHONPATH=$t/src .venv/bin/python \\
        benchmarks/attention_kernel.py; done; done
"""

from __future__ import annotations

import argparse
import time

import torch

from inhouse.engine.kernels.build import load_kernels
from inhouse.engine.kernels.quant import kv_rows_int8

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16


def _cache(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(tokens)
    blocks = -(-tokens // BLOCK)
    k, v = (
        kv_rows_int8(x) if dtype == torch.int8 else x.to(dtype)
        for x in torch.randn(2, blocks * BLOCK, KV_HEADS, DIM, generator=gen)
    )
    table = torch.randperm(blocks, generator=gen)[None]
    return k, v, table


def best_ms(call, repeats: int) -> float:
    """The fastest of `repeats` calls, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def rows_ms(rows: int, last: int, dtype: torch.dtype, repeats: int, layers: int) -> float:
    """`rows` rows of one sequence, the last attending `last` keys (a decode: 1 row; a
    speculative step: its draft's rows too), over `layers` distinct caches taken in turn
    (30, a step's: their keys come from memory, as in a real step; 1: the one cache stays
    in the CPU's caches): ms for all the layers."""
    caches = [_cache(last + layer * BLOCK, dtype) for layer in range(layers)]
    q = torch.randn(rows, HEADS, DIM)
    seq = torch.zeros(rows, dtype=torch.long)
    lens = torch.arange(last - rows + 1, last + 1)
    op = torch.ops.inhouse_cpu.paged_attention_rows

    def step() -> None:
        for k, v, table in caches:
            op(q, k, v, table, seq, lens, BLOCK, 0.125, 0)

    return best_ms(step, repeats)


def prefill_ms(tokens: int, dtype: torch.dtype, repeats: int) -> float:
    """A whole prompt of `tokens` rows, each attending its causal prefix."""
    k, v, table = _cache(tokens, dtype)
    q = torch.randn(tokens, HEADS, DIM)
    seq = torch.zeros(tokens, dtype=torch.long)
    lens = torch.arange(1, tokens + 1)
    op = torch.ops.inhouse_cpu.paged_attention_rows
    return best_ms(lambda: op(q, k, v, table, seq, lens, BLOCK, 0.125, 0), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="128,2500", help="decode context lengths")
    parser.add_argument("--prompts", default="512,2500", help="prefill lengths")
    parser.add_argument("--draft-rows", default="", help="a draft step's rows, e.g. 3,17")
    parser.add_argument(
        "--draft-context", type=int, default=600, help="keys before a draft step's first row"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--layers", type=int, default=1, help="decode: distinct caches a step (30: from memory)"
    )
    parser.add_argument(
        "--dtype", choices=["float16", "bfloat16", "float32", "int8"], default="float16"
    )
    args = parser.parse_args()
    built = load_kernels()
    if built is None:
        raise SystemExit("the C++ kernels do not build here")
    dtype = getattr(torch, args.dtype)
    print(
        f"kernels {built.isa}, {args.dtype} cache, {torch.get_num_threads()} threads, "
        f"decode over {args.layers} distinct cache(s)"
    )
    for n in map(int, args.contexts.split(",")):
        repeats = max(args.repeats, args.repeats * 20 // args.layers)
        ms = rows_ms(1, n, dtype, repeats, args.layers) / args.layers
        flops = 4 * HEADS * DIM * n
        print(f"decode  ctx {n:5d}: {ms:8.3f} ms  {flops / ms / 1e6:6.1f} GFLOP/s")
    for rows in (int(r) for r in args.draft_rows.split(",") if r):
        ms = rows_ms(rows, args.draft_context + rows, dtype, args.repeats * 8, 30)
        print(f"draft   {rows:2d} rows after {args.draft_context}: {ms:8.3f} ms for 30 layers")
    for n in map(int, args.prompts.split(",")):
        ms = prefill_ms(n, dtype, args.repeats)
        flops = 4 * HEADS * DIM * n * (n + 1) / 2
        print(f"prefill {n:5d}: {ms:8.1f} ms  {flops / ms / 1e6:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
