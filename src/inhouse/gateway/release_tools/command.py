"""CLI: `inhouse release status|canary|promote|rollback|compare`.

Each command is one change in the gateway database (audited in `release_events`); every
gateway replica sharing the database applies it from its next request.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from inhouse.gateway.cli_options import ConfigOption, DatabaseOption, settings_for
from inhouse.launch import BACKENDS
from inhouse.manifests.command import checked_manifest

if TYPE_CHECKING:
    from inhouse.gateway.config import GatewayConfig, ModelRoute
    from inhouse.gateway.releases.store import NewRelease, ReleaseState, ReleaseStore
    from inhouse.manifests.manifest import Manifest

release_app = typer.Typer(
    help="Release a new model safely: canary, shadow, promote, roll back, compare.",
    no_args_is_help=True,
)

ByOption = Annotated[str | None, typer.Option("--by", help="Who (default: the login name).")]
ReasonOption = Annotated[str | None, typer.Option("--reason", help="Why, for the change log.")]


@release_app.command("status")
def status_command(
    model: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Shares, releases, live figures with their intervals, and the latest changes."""
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.gateway.release_tools.report import print_status, status_json

    store = _store(config, database)
    report = status_json(store, model)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        print_status(report)


@release_app.command("canary")
def canary_command(
    model: str,
    percent: Annotated[float, typer.Option(help="Share of keys the candidate answers (0-100).")],
    backend: Annotated[
        list[str] | None,
        typer.Option(
            help="Candidate backend: a name from the config or an URL (repeatable). "
            "Without it, changes the shares of the current candidate."
        ),
    ] = None,
    shadow: Annotated[float, typer.Option(help="Share of stable requests mirrored.")] = 0.0,
    manifest: Annotated[Path | None, typer.Option(help="Manifest the candidate serves.")] = None,
    upstream_model: Annotated[
        str | None, typer.Option(help="Model name the URL backend serves.")
    ] = None,
    kind: Annotated[str, typer.Option(help="Engine of an URL backend.")] = "inhouse",
    adapter: Annotated[
        str | None,
        typer.Option(
            help="For a LoRA adapter MODEL: the adapter version the candidate sends, as the "
            "backends serve it (e.g. support-v2; default: MODEL itself)."
        ),
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option(help="Variable holding the URL backend's key (in the gateway).")
    ] = None,
    max_output: Annotated[int | None, typer.Option(help="Output cap of the release.")] = None,
    sampling: Annotated[
        str | None, typer.Option(help='Sampling defaults as JSON, e.g. {"temperature": 0.2}.')
    ] = None,
    max_error_rate: Annotated[float, typer.Option(help="Guardrail: 5xx share.")] = 0.05,
    max_p99_ttft: Annotated[float | None, typer.Option(help="Guardrail: p99 TTFT, s.")] = None,
    min_agreement: Annotated[
        float | None, typer.Option(help="Guardrail: agreement with the stable (0-1).")
    ] = None,
    min_samples: Annotated[int, typer.Option(help="Guardrail: answers before judging.")] = 20,
    window: Annotated[float, typer.Option(help="Guardrail: window, s.")] = 300.0,
    by: ByOption = None,
    reason: ReasonOption = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Send PERCENT of MODEL's keys to a candidate release (sticky per key), and mirror
    SHADOW percent of the rest to it. MODEL may be a LoRA adapter: its candidate is another
    version of it (--adapter) or the same name on other backends."""
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.gateway.releases.store import BackendRef, Guardrails, NewRelease

    settings = settings_for(config, database)
    new = None
    if backend:
        extra = {"kind": kind, "model": upstream_model, "api_key_env": api_key_env}
        refs = tuple(BackendRef.parse(b, **extra) for b in backend)
        _check_names(settings, refs)
        digest, pinned = pinned_manifest(manifest) if manifest else (None, None)
        guard = _or_exit(lambda: Guardrails(max_error_rate, max_p99_ttft, min_agreement,
                                            min_samples, window))  # fmt: skip
        new = NewRelease(refs, digest, pinned, _sampling(sampling), _cap(max_output), guard,
                         _adapter_version(settings, model, adapter))  # fmt: skip
    store = _store(config, database)
    state = _or_exit(lambda: store.canary(model, _first(settings, model), new, percent, shadow,
                                          _actor(by), reason))  # fmt: skip
    typer.echo(_summary(state))


@release_app.command("promote")
def promote_command(
    model: str,
    by: ByOption = None,
    reason: ReasonOption = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Make the candidate the stable release for every request."""
    store = _store(config, database)
    typer.echo(_summary(_or_exit(lambda: store.promote(model, _actor(by), reason))))


@release_app.command("rollback")
def rollback_command(
    model: str,
    by: ByOption = None,
    reason: ReasonOption = None,
    to: Annotated[int | None, typer.Option("--to", help="Make release N the stable one.")] = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Drop the candidate (or go back to the release before the stable one, or to --to N)."""
    store = _store(config, database)
    typer.echo(_summary(_or_exit(lambda: store.rollback(model, _actor(by), reason, to))))


@release_app.command("compare")
def compare_command(
    model: str,
    release: Annotated[
        int | None, typer.Option(help="Candidate release (default: the current one).")
    ] = None,
    png: Annotated[Path, typer.Option(help="Where to write the PNG.")] = Path(
        "release-compare.png"
    ),
    grade: Annotated[
        Path | None,
        typer.Option(
            help="Eval set (JSONL): grade the stored answers of the shadow pairs that asked "
            "one of its items, stable against candidate."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Agreement with the stable release (95% interval); failures, refusals, JSON-schema and
    tool-call validity on both releases with their paired differences and exact McNemar
    p-values; TTFT, TPOT and latency p50/p99, output length; the canary's live figures;
    optionally the answers graded with an eval set; and a PNG."""
    # SQLAlchemy, httpx, rich: loaded when the command runs, not with the CLI.
    from inhouse.gateway.release_tools.compare import compare, compare_text

    items = None if grade is None else _eval_set(grade)  # checked before anything is opened
    store = _store(config, database)
    grader = None
    if items is not None:
        from inhouse.gateway.keys import KeyStore, load_pepper
        from inhouse.gateway.release_tools.grade import grade_pairs

        keys = KeyStore(store.db, load_pepper(settings_for(config, database)))
        grader = functools.partial(grade_pairs, store.db, keys.hash, model, items=items)
    report = _or_exit(lambda: compare(store, model, release, png, grader))
    typer.echo(json.dumps(report, indent=2) if as_json else compare_text(report))


def _eval_set(path: Path) -> list[Any]:
    # jsonschema: loaded when the command runs, not with the CLI.
    from inhouse.eval.items import EvalSetError, load_eval_set

    try:
        return load_eval_set(path)
    except (OSError, EvalSetError) as err:
        raise _fail(f"--grade: {err}") from None


def _store(config: Path | None, database: str | None) -> ReleaseStore:
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.releases.store import ReleaseStore

    return ReleaseStore(open_database(settings_for(config, database).database))


def _first(settings: GatewayConfig, model: str) -> NewRelease | None:
    """Release 1 if the model has none yet: its backends in the gateway config (None
    without a config)."""
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.gateway.releases.store import BackendRef, NewRelease

    if not settings.models:
        return None
    route = settings.model(model) or _base_of(settings, model)
    return NewRelease(tuple(BackendRef(name=b.name) for b in route.backends))


def _base_of(settings: GatewayConfig, adapter: str) -> ModelRoute:
    """The base model of a LoRA adapter: the one whose backends declare it in the config
    (`adapters = [...]`)."""
    routes = [m for m in settings.models if adapter in m.adapters]
    if not routes:
        raise _fail(f"{adapter!r} is not in the gateway config (neither a model nor an "
                    "adapter its backends declare)")  # fmt: skip
    return routes[0]


def _adapter_version(settings: GatewayConfig, model: str, adapter: str | None) -> str | None:
    """`--adapter`, checked: only for an adapter, never a model's name."""
    if adapter is None:
        return None
    if settings.model(model) is not None:
        raise _fail(f"--adapter is for a LoRA adapter's releases; {model!r} is a model")
    if settings.model(adapter) is not None:
        raise _fail(f"--adapter {adapter!r} is a model's name, not an adapter's")
    return None if adapter == model else adapter


def _check_names(settings: GatewayConfig, refs: Any) -> None:
    known = {b.name for m in settings.models for b in m.backends}
    for ref in refs:
        if ref.url is None and ref.name not in known:
            raise _fail(f"no backend named {ref.name!r} in the gateway config; give an URL")
        if ref.url is not None and ref.kind not in BACKENDS:
            raise _fail(f"--kind must be one of {sorted(BACKENDS)}, got {ref.kind!r}")


def pinned_manifest(path: Path, pinned: Manifest | None = None) -> tuple[str, dict[str, Any]]:
    """The manifest file's sha256 and what it pins; unless given the `pinned` manifest
    already verified, the model's files are verified against it first."""
    if pinned is None:
        pinned = checked_manifest(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    summary = {
        "path": str(path.resolve()),
        "name": pinned.name,
        "revision": pinned.revision,
        "dtype": pinned.dtype,
        "quantization": pinned.quantization,
        "files": pinned.files,
    }
    if pinned.adapters:  # each adapter by its files' digest: the version the release serves
        summary["adapters"] = {a.name: {"revision": a.revision, "files": a.files}
                               for a in pinned.adapters}  # fmt: skip
    return digest, summary


def _sampling(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise _fail("--sampling must be a JSON object") from None
    if not isinstance(value, dict):
        raise _fail("--sampling must be a JSON object")
    return value


def _cap(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 1_000_000:
        raise _fail("--max-output must be 1..1000000")
    return value


def _actor(by: str | None) -> str:
    return by or getpass.getuser()


def _summary(state: ReleaseState) -> str:
    line = f"{state.model}: stable release {state.stable}"
    if state.candidate is not None:
        line += (
            f", candidate release {state.candidate} at {state.percent:g}% of keys"
            f" (shadow {state.shadow:g}%)"
        )
    return line + f" · state version {state.version}"


def _or_exit(action: Any) -> Any:
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.gateway.releases.store import ReleaseError

    try:
        return action()
    except ReleaseError as err:
        raise _fail(str(err)) from None


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)
