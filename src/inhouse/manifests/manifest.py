"""The model manifest: a TOML file a team keeps in its repo that pins what a server may load.

```toml
[model]
name = "SmolLM2-135M-Instruct"   # the served model name
source = "models/smollm2"         # an HF folder or a .gguf file, relative to this file
revision = "9a1b..."              # the HF commit, or a digest of the files below
dtype = "auto"
quantization = "auto"

[files]                           # every weight, tokenizer and config file: sha256
"config.json" = "…"
```
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MANIFEST = "inhouse.model.toml"
MODEL_KEYS = ("name", "source", "revision", "dtype", "quantization")


class ManifestError(ValueError):
    """A manifest that cannot be read, or whose files do not match it."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """A model's pinned identity: where it is, which revision, and each file's sha256."""

    name: str
    source: str
    revision: str
    files: dict[str, str]
    dtype: str = "auto"
    quantization: str = "auto"
    path: Path | None = field(default=None, compare=False)  # the file it was read from

    def source_path(self) -> Path:
        """The source, resolved against the manifest's own folder when relative."""
        source = Path(self.source).expanduser()
        if source.is_absolute() or self.path is None:
            return source
        return self.path.parent / source

    def to_toml(self) -> str:
        """The manifest as TOML text (strings quoted as JSON, which TOML reads the same)."""
        lines = ["[model]"]
        lines += [f"{key} = {json.dumps(getattr(self, key))}" for key in MODEL_KEYS]
        lines += ["", "[files]"]
        lines += [
            f"{json.dumps(name)} = {json.dumps(sha)}" for name, sha in sorted(self.files.items())
        ]
        return "\n".join(lines) + "\n"


def read_manifest(path: Path) -> Manifest:
    """Parse and check a manifest file; :class:`ManifestError` names what is wrong."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise ManifestError(f"cannot read manifest {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ManifestError(f"manifest {path} is not valid TOML: {err}") from None
    model, files = data.get("model"), data.get("files")
    if not isinstance(model, dict) or not isinstance(files, dict) or not files:
        raise ManifestError(f"manifest {path} needs a [model] table and a non-empty [files] table")
    for key in ("name", "source", "revision"):
        if not isinstance(model.get(key), str) or not model[key]:
            raise ManifestError(f"manifest {path}: [model] {key} must be a non-empty string")
    bad = [name for name, sha in files.items() if not _is_sha256(sha)]
    if bad:
        raise ManifestError(f"manifest {path}: [files] {bad[0]!r} is not a sha256 hex digest")
    return Manifest(
        name=model["name"],
        source=model["source"],
        revision=model["revision"],
        files=dict(files),
        dtype=str(model.get("dtype", "auto")),
        quantization=str(model.get("quantization", "auto")),
        path=path.resolve(),
    )


def _is_sha256(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )
