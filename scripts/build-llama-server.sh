#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once, from the llama.cpp that the llama-cpp-python
# source distribution on PyPI vendors (pip is the only network access it needs), into
# ~/.cache/inhouse/llama.cpp (or $XDG_CACHE_HOME/inhouse/llama.cpp). Idempotent: an
# existing binary is reused. ~10 minutes on 2 cores the first time. `inhouse up --engine
# llama.cpp` and the tests find it there (inhouse/launch/llamacpp.py: built_binary).
set -euo pipefail
VERSION=0.3.36  # keep equal to LLAMA_CPP_PYTHON in src/inhouse/launch/llamacpp.py
PY=${PY:-python3}
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/inhouse/llama.cpp"
TREE="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
BIN="$TREE/build/bin/llama-server"
# This llama.cpp's AMX kernels die at their first tile instruction (SIGILL in
# tinygemm_kernel_amx on a Xeon with AMX; an unfixed upstream bug, see llama.cpp PR #26954),
# so on a CPU with AMX it is built without them: AVX-512 VNNI does that work. The flags are
# stamped next to the build, so a binary built with other flags is rebuilt.
FLAGS=""
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
STAMP="$TREE/build/inhouse-flags"
if [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "flags:$FLAGS" ]; then
    echo "llama-server: $BIN"
    exit 0
fi
mkdir -p "$CACHE"
if [ ! -f "$TREE/CMakeLists.txt" ]; then
    "$PY" -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$CACHE"
    tar -xzf "$CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"
    rm -f "$CACHE/llama_cpp_python-$VERSION.tar.gz"
fi
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then  # no system cmake: the PyPI one, into the caller's environment
    "$PY" -m pip install -q cmake
    CMAKE="$(dirname "$PY")/cmake"
fi
"$CMAKE" -S "$TREE" -B "$TREE/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS"
"$CMAKE" --build "$TREE/build" -j"$(nproc)" --target llama-server
echo "flags:$FLAGS" > "$STAMP"
echo "llama-server: $BIN"
