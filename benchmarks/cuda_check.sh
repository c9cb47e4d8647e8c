#!/usr/bin/env bash
# The CUDA path end to end on a GPU machine: our greedy tokens vs HF's on CUDA, then
# `inhouse serve --device cuda` driven by `inhouse bench run` at 1, 16 and 64 streams.
#   benchmarks/cuda_check.sh [MODEL] [OUT_DIR]
# MODEL defaults to the bundled SmolLM2 GGUF; any HF folder works (the H200 run in
# docs/benchmarks.md used SmolLM2-135M's config and tokenizer with random bf16 weights).
set -uo pipefail
MODEL=${1:-}
OUT=${2:-bench-out/cuda}
PORT=${PORT:-8011}
INHOUSE=(python3 -c 'from inhouse.cli import main; main()')
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pytest -p no:cacheprovider tests/engine/test_model_equality.py \
    tests/engine/test_step_threads.py -k cuda -q
"${INHOUSE[@]}" serve $MODEL --device cuda --port "$PORT" --served-model-name cuda-check \
    --embedding-model none >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 180); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
for C in 1 16 64; do
    "${INHOUSE[@]}" bench run --base-url "http://127.0.0.1:$PORT" --model cuda-check \
        --max-concurrency "$C" --num-prompts $((C * 4 > 16 ? C * 4 : 16)) \
        --input-len 256 --output-len 128 --ignore-eos --out "$OUT/c$C"
done
