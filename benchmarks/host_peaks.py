"""This host's limits and the floors they put under the bundled model's step times: the
float32 FMA rate, the AVX2 int8 multiply-add rate (vpmaddubsw + vpmaddwd, the q4/q8
linears' instructions without VNNI), the AMX tiles' int8 rate at their full depth of 64 and
at the linears' depth of 32 (one group of codes a product: half the work an instruction)
and their bf16 rate, where the CPU has tiles, and the rate of reading memory, measured by a
small C++ probe (``host_peaks.cpp``, built here with g++ for this CPU), on one thread and on
all.

From them and the loaded model (q4 weights, the KV cache in ``--kv-cache-dtype``):
  - a c=1 decode step cannot take less than its weights' bytes over the read rate;
  - a decode step at ~2.5k tokens of context adds its sequences' KV bytes over that rate
    (the attention reads them after the linears, not during);
  - a ~2.5k-token prefill cannot take less than its linears' int8 multiply-adds at the int8
    rate (the tiles' depth-32 rate on an AMX host) plus its causal attention's float32 FMAs
    at the FMA rate.

    .venv/bin/python benchmarks/host_peaks.py [--kv-cache-dtype int8] [--context 2500]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from inhouse.engine.kernels.build import cpu_flags
from inhouse.engine.kv_budget import kv_bytes_per_token
from inhouse.engine.models.llama import Linear
from inhouse.engine.models.loader import load_model, with_kv_cache_dtype

PROBE = Path(__file__).with_name("host_peaks.cpp")


def probe(threads: int) -> dict[str, float]:
    """The probe's rates on `threads` OpenMP threads."""
    with tempfile.TemporaryDirectory() as folder:
        binary = Path(folder) / "host_peaks"
        compile_ = ["g++", "-O3", "-march=native", "-fopenmp", "-std=c++17", str(PROBE)]
        subprocess.run([*compile_, "-o", str(binary)], check=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        out = subprocess.run([str(binary)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def print_rates(rates: dict[int, dict[str, float]]) -> None:
    print(f"CPU flags: {' '.join(sorted(cpu_flags()))}")
    print(
        "threads | fp32 FMA GFLOP/s | int8 madd GOP/s | AMX int8 GOP/s (depth 64 / 32) "
        "| AMX bf16 GFLOP/s | read GB/s"
    )
    for n, r in rates.items():
        fma, int8, read = r["fp32_fma_gflops"], r["int8_madd_gops"], r["read_gbs"]
        amx = _amx(r["amx_int8_gops"]) + " / " + _amx(r["amx_int8_group_gops"])
        bf16 = _amx(r["amx_bf16_gflops"])
        print(f"{n:7d} | {fma:16.1f} | {int8:15.1f} | {amx:>30} | {bf16:>16} | {read:9.2f}")


def _amx(rate: float) -> str:
    return f"{rate:.1f}" if rate >= 0 else "none"


def linear_rate(rates: dict[str, float]) -> float:
    """The int8 rate the prefill's linears run at: the tiles' where the CPU has them."""
    tiles = rates["amx_int8_group_gops"]
    return tiles if tiles >= 0 else rates["int8_madd_gops"]


def print_floors(rates: dict[str, float], kv_cache_dtype: str, n: int) -> None:
    """The bundled model's floors at these rates, with `n` tokens of long context."""
    loaded = with_kv_cache_dtype(load_model(None, quantization="auto"), kv_cache_dtype)
    model, config = loaded.model, loaded.hf_config
    linears = [m.quantized for m in model.modules() if isinstance(m, Linear) and m.quantized]
    head = model.lm_head.quantized
    weight_bytes = sum(w.nbytes for w in linears)
    # a prefill multiplies every row by the layers' linears, and only its last by the head
    body_macs = sum(w.in_features * w.q.shape[0] * 8 for w in linears if w is not head)
    head_dim = config.hidden_size // config.num_attention_heads
    per_pair = config.num_hidden_layers * config.num_attention_heads * head_dim * 4
    attention_flops = per_pair * n * (n + 1) / 2

    def read_ms(num_bytes: float) -> float:
        return num_bytes / (rates["read_gbs"] * 1e9) * 1e3

    print(f"\nbundled model ({loaded.quantization} weights, {loaded.kv_cache_dtype} KV cache)")
    mb = weight_bytes / 1e6
    print(f"a decode step's weights: {mb:.1f} MB -> >= {read_ms(weight_bytes):.2f} ms a step")
    for c in (1, 4):
        kv = c * n * kv_bytes_per_token(loaded)
        mb = kv / 1e6
        print(f"KV of {c} sequence(s) at {n} tokens: {mb:.1f} MB -> adds >= {read_ms(kv):.2f} ms")
    linear_ops = 2 * body_macs * n
    linear_ms = linear_ops / (linear_rate(rates) * 1e9) * 1e3
    attention_ms = attention_flops / (rates["fp32_fma_gflops"] * 1e9) * 1e3
    print(
        f"a {n}-token prefill: linears {linear_ops / 1e12:.2f} TOP (>= {linear_ms:.0f} ms), "
        f"attention {attention_flops / 1e12:.2f} TFLOP (>= {attention_ms:.0f} ms): "
        f"TTFT >= {linear_ms + attention_ms:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "int8"))
    parser.add_argument("--context", type=int, default=2500, help="the long context, tokens")
    args = parser.parse_args()

    threads = len(os.sched_getaffinity(0))
    rates = {n: probe(n) for n in sorted({1, threads})}
    print_rates(rates)
    print_floors(rates[threads], args.kv_cache_dtype, args.context)


if __name__ == "__main__":
    main()
