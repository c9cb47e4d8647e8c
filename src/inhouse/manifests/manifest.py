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

[adapters.support]                # LoRA adapters served with it (optional), each pinned
source = "adapters/support"       # the same way: a PEFT folder, relative to this file
revision = "sha256:…"             # a digest of its files: the version a release names

[adapters.support.files]
"adapter_config.json" = "…"
"adapter_model.safetensors" = "…"
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
    # LoRA adapters served with the model, pinned alike (their `path` is this manifest's).
    adapters: tuple[Manifest, ...] = ()

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
        for adapter in self.adapters:
            table = f"adapters.{json.dumps(adapter.name)}"
            lines += ["", f"[{table}]", f"source = {json.dumps(adapter.source)}"]
            lines += [f"revision = {json.dumps(adapter.revision)}", "", f"[{table}.files]"]
            lines += [
                f"{json.dumps(n)} = {json.dumps(sha)}" for n, sha in sorted(adapter.files.items())
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
    _check_pins(path, "[model]", model, files, ("name", "source", "revision"))
    adapters = data.get("adapters", {})
    if not isinstance(adapters, dict):
        raise ManifestError(f"manifest {path}: [adapters] must be a table of adapters")
    return Manifest(
        name=model["name"],
        source=model["source"],
        revision=model["revision"],
        files=dict(files),
        dtype=str(model.get("dtype", "auto")),
        quantization=str(model.get("quantization", "auto")),
        path=path.resolve(),
        adapters=tuple(_adapter(path, name, table) for name, table in adapters.items()),
    )


def _adapter(path: Path, name: str, table: object) -> Manifest:
    """One `[adapters.NAME]` table as the adapter's own pins."""
    where = f"[adapters.{name}]"
    files = table.get("files") if isinstance(table, dict) else None
    if not isinstance(table, dict) or not isinstance(files, dict) or not files:
        raise ManifestError(f"manifest {path}: {where} needs a source and a non-empty files table")
    _check_pins(path, where, table, files, ("source", "revision"))
    return Manifest(name, table["source"], table["revision"], dict(files), path=path.resolve())


def _check_pins(
    path: Path,
    where: str,
    table: dict[str, object],
    files: dict[str, object],
    keys: tuple[str, ...],
) -> None:
    for key in keys:
        if not isinstance(table.get(key), str) or not table[key]:
            raise ManifestError(f"manifest {path}: {where} {key} must be a non-empty string")
    bad = [name for name, sha in files.items() if not _is_sha256(sha)]
    if bad:
        raise ManifestError(f"manifest {path}: {where} files {bad[0]!r} is not a sha256 hex digest")


def _is_sha256(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )
