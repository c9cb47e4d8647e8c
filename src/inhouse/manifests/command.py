"""``inhouse models lock|verify``, and the up-front check ``serve`` and ``up`` run.

The progress bar and the hashing are imported when a command runs, not with the CLI.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from inhouse.manifests.manifest import DEFAULT_MANIFEST, Manifest, ManifestError, read_manifest
from inhouse.manifests.pickles import PickleRefused

EXIT_MISMATCH = 1
T = TypeVar("T")

models_app = typer.Typer(
    help="Pin a model's files in a manifest (lock) and check them (verify).",
    no_args_is_help=True,
)


@contextmanager
def byte_progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A transient bar on stderr over ``total`` bytes; yields the callback to advance it."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(label, total=total)
    with bar:
        yield lambda n: bar.advance(task, n)


def checked_manifest(path: Path, rehash: bool = False) -> Manifest:
    """Read ``path`` and verify the model against it, with progress; exit 1 naming the
    files when anything differs, is missing or unexpected."""
    from inhouse.manifests.hashing import HashCache
    from inhouse.manifests.verify import require_verified, total_bytes

    manifest = _or_exit(lambda: read_manifest(path))
    source = manifest.source_path()
    total = total_bytes(source) if source.exists() else 0
    with byte_progress(f"verifying {source.name}", total) as advance:
        _or_exit(lambda: require_verified(manifest, HashCache(trust=not rehash), advance))
    return manifest


def _or_exit(action: Callable[[], T]) -> T:
    try:
        return action()
    except (ManifestError, PickleRefused) as err:
        typer.echo(f"inhouse: {err}", err=True)
        raise typer.Exit(EXIT_MISMATCH) from None


@models_app.command("lock")
def lock_command(
    path: Annotated[Path, typer.Argument(help="An HF folder or a .gguf file.")],
    out: Annotated[Path, typer.Option(help="Where to write the manifest.")] = Path(
        DEFAULT_MANIFEST
    ),
    name: Annotated[str | None, typer.Option(help="Served model name.")] = None,
    revision: Annotated[
        str | None, typer.Option(help="HF commit or your label (default: detected or a digest).")
    ] = None,
    dtype: Annotated[str, typer.Option(help="dtype to serve with, as inhouse serve.")] = "auto",
    quantization: Annotated[str, typer.Option(help="As inhouse serve --quantization.")] = "auto",
    lora_modules: Annotated[
        list[str] | None,
        typer.Option(
            help="A PEFT LoRA adapter to pin (and serve with --manifest), as name=path; "
            "repeat the flag for more."
        ),
    ] = None,
) -> None:
    """Hash every weight, tokenizer and config file of PATH (and of each adapter) into a
    manifest."""
    from inhouse.manifests.verify import lock, lock_adapter, total_bytes

    adapters = _adapter_paths(lora_modules or [])
    for where in (path, *adapters.values()):
        if not where.exists():
            typer.echo(f"inhouse: {where} does not exist", err=True)
            raise typer.Exit(EXIT_MISMATCH)
    source = path.resolve()
    with byte_progress(f"hashing {source.name}", total_bytes(source)) as advance:
        manifest = _or_exit(
            lambda: lock(source, name, revision, dtype, quantization, progress=advance)
        )
    out_dir = out.resolve().parent  # a source below the manifest is kept relative to it
    pinned_adapters = tuple(
        _relative(_or_exit(functools.partial(lock_adapter, n, p.resolve())), out_dir)
        for n, p in adapters.items()
    )
    pinned = dataclasses.replace(_relative(manifest, out_dir), adapters=pinned_adapters)
    out.write_text(pinned.to_toml())
    also = f" and {len(adapters)} adapter(s)" if adapters else ""
    typer.echo(f"locked {_files(pinned)} of {source}{also} at {pinned.revision} into {out}")


def _relative(pinned: Manifest, out_dir: Path) -> Manifest:
    """The pins with their source relative to the manifest's folder when below it."""
    source = Path(pinned.source)
    written = source.relative_to(out_dir) if source.is_relative_to(out_dir) else source
    return dataclasses.replace(pinned, source=str(written))


def _adapter_paths(values: list[str]) -> dict[str, Path]:
    """`--lora-modules name=path` entries by name (exit 2 on a malformed or repeated one)."""
    found: dict[str, Path] = {}
    for value in values:
        name, sep, where = value.partition("=")
        if not sep or not name or not where or name in found:
            raise typer.BadParameter(f"{value!r}: give each adapter once, as name=path",
                                     param_hint="--lora-modules")  # fmt: skip
        found[name] = Path(where).expanduser()
    return found


@models_app.command("verify")
def verify_command(
    manifest: Annotated[Path, typer.Argument(help="The manifest to check.")] = Path(
        DEFAULT_MANIFEST
    ),
    rehash: Annotated[
        bool, typer.Option(help="Hash every file again, ignoring the size + mtime cache.")
    ] = False,
) -> None:
    """Check that the model's files match the manifest, without serving it (exit 1 if not)."""
    checked = checked_manifest(manifest, rehash)
    where, revision = checked.source_path(), checked.revision
    typer.echo(f"ok: {_files(checked)} of {where} verified at revision {revision}")


def _files(manifest: Manifest) -> str:
    count = len(manifest.files)
    return f"{count} file" + ("" if count == 1 else "s")
