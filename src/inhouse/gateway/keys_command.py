"""CLI: `inhouse keys create|list|update|rotate|revoke`. Its heavy imports (SQLAlchemy) happen
inside the commands."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from inhouse.gateway.cli_options import (
    AdaptersOption,
    ConfigOption,
    DatabaseOption,
    MaxImagesOption,
    parse_period,
    settings_for,
    short_time,
)
from inhouse.gateway.name_lists import from_option, shown

if TYPE_CHECKING:
    from inhouse.gateway.keys import ApiKey, KeyStore

keys_app = typer.Typer(
    help="Create, list, update, rotate and revoke gateway API keys.", no_args_is_help=True
)


@keys_app.command("create")
def keys_create(
    name: str,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option(help="Tokens per minute.")] = None,
    max_concurrent: Annotated[int | None, typer.Option(help="Concurrent requests.")] = None,
    quota_tokens: Annotated[int | None, typer.Option(help="Token quota per --period.")] = None,
    period: Annotated[str, typer.Option(help="Quota period, e.g. 1d, 30d.")] = "30d",
    expires: Annotated[str | None, typer.Option(help="Lifetime (e.g. 90d) or ISO date.")] = None,
    models: Annotated[str | None, typer.Option(help="Comma-separated models allowed.")] = None,
    adapters: AdaptersOption = None,
    no_fallback: Annotated[
        bool, typer.Option(help="Data must not leave: never fall back.")
    ] = False,
    log_content: Annotated[
        bool, typer.Option(help="Store redacted prompt/completion text.")
    ] = False,
    team: Annotated[
        str | None, typer.Option(help="The team whose quota and budget it shares.")
    ] = None,
    admin: Annotated[bool, typer.Option(help="May use the admin console and API.")] = False,
    priority: Annotated[
        str, typer.Option(help="Class: interactive, default or batch (queue order, upstream).")
    ] = "default",
    no_degrade: Annotated[
        bool, typer.Option(help="Never answer from a smaller model under overload: wait or 429.")
    ] = False,
    max_images: MaxImagesOption = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Create a key; its secret is printed once and never stored."""
    store = _store(config, database)
    if team is not None:
        _ensure_team(config, database, team)
    values: dict[str, Any] = {
        "rpm": rpm,
        "tpm": tpm,
        "max_concurrent": max_concurrent,
        "max_images": max_images,
        "quota_tokens": quota_tokens,
        "quota_period_s": parse_period(period) if quota_tokens is not None else None,
        "expires_at": _expiry(expires),
        "models": from_option(models),
        "adapters": from_option(adapters),
        "allow_fallback": not no_fallback,
        "log_content": log_content,
        "team": team,
        "admin": admin,
        "priority": priority,
        "allow_degrade": not no_degrade,
    }
    try:
        key, secret = store.create(name, **values)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    typer.echo(f"created key {key.name!r}; its secret is shown only now:")
    typer.echo(secret)


@keys_app.command("list")
def keys_list(config: ConfigOption = None, database: DatabaseOption = None) -> None:
    """List keys with their limits and state (never their secrets)."""
    from rich.console import Console
    from rich.table import Table

    table = Table()
    columns = ("name", "state", "created", "expires", "rpm", "tpm", "concurrent", "quota", "models")
    for column in columns:
        table.add_column(column)
    now = time.time()
    for key in _store(config, database).list():
        table.add_row(
            key.name
            + (f" @{key.team}" if key.team else "")
            + (" (admin)" if key.admin else "")
            + f" ({key.priority}{'' if key.allow_degrade else ', no degrade'})",
            key.state_at(now),
            short_time(key.created_at),
            short_time(key.expires_at) if key.expires_at else "never",
            _limit(key.rpm),
            _limit(key.tpm),
            _limit(key.max_concurrent),
            _quota(key, now),
            shown(key.models)
            + ("" if key.adapters is None else f"; adapters {shown(key.adapters)}"),
        )
    Console().print(table)


@keys_app.command("revoke")
def keys_revoke(name: str, config: ConfigOption = None, database: DatabaseOption = None) -> None:
    """Revoke a key: refused from the very next request, on every replica."""
    _edit(lambda store: store.revoke(name), config, database)
    typer.echo(f"revoked key {name!r}")


@keys_app.command("rotate")
def keys_rotate(name: str, config: ConfigOption = None, database: DatabaseOption = None) -> None:
    """Give a key a new secret: the old one is refused from the very next request, on every
    replica, and the key's console sessions end; its limits and usage stay."""
    secrets: list[str] = []
    _edit(lambda store: secrets.append(store.rotate(name)[1]), config, database)
    typer.echo(f"rotated key {name!r}; its new secret is shown only now:")
    typer.echo(secrets[0])


@keys_app.command("update")
def keys_update(
    name: str,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute (0: no limit).")] = None,
    tpm: Annotated[int | None, typer.Option(help="Tokens per minute (0: no limit).")] = None,
    max_concurrent: Annotated[int | None, typer.Option(help="Concurrency (0: no limit).")] = None,
    quota_tokens: Annotated[int | None, typer.Option(help="Token quota (0: no quota).")] = None,
    period: Annotated[str | None, typer.Option(help="Quota period, e.g. 30d.")] = None,
    expires: Annotated[str | None, typer.Option(help="Lifetime, ISO date, or 'never'.")] = None,
    models: Annotated[str | None, typer.Option(help="Comma-separated models, or 'all'.")] = None,
    adapters: AdaptersOption = None,
    fallback: Annotated[bool | None, typer.Option(help="Allow fallback endpoints.")] = None,
    log_content: Annotated[bool | None, typer.Option(help="Store redacted text.")] = None,
    team: Annotated[str | None, typer.Option(help="Move to this team ('none': no team).")] = None,
    admin: Annotated[bool | None, typer.Option(help="May use the admin console and API.")] = None,
    priority: Annotated[
        str | None, typer.Option(help="Class: interactive, default or batch.")
    ] = None,
    degrade: Annotated[
        bool | None, typer.Option(help="May be answered by a smaller model under overload.")
    ] = None,
    max_images: MaxImagesOption = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Change a key's limits; applies from its next request."""
    changes: dict[str, Any] = {}
    if team is not None:
        changes["team"] = None if team == "none" else team
        if team != "none":
            _ensure_team(config, database, team)
    for field, value in (
        ("rpm", rpm),
        ("tpm", tpm),
        ("max_concurrent", max_concurrent),
        ("quota_tokens", quota_tokens),
        ("max_images", max_images),
    ):
        if value is not None:
            changes[field] = value or None
    if period is not None:
        changes["quota_period_s"] = parse_period(period)
    if expires is not None:
        changes["expires_at"] = None if expires == "never" else _expiry(expires)
    for field, names in (("models", models), ("adapters", adapters)):
        if names is not None:
            changes[field] = from_option(names)
    if fallback is not None:
        changes["allow_fallback"] = fallback
    if log_content is not None:
        changes["log_content"] = log_content
    if admin is not None:
        changes["admin"] = admin
    if priority is not None:
        changes["priority"] = priority
    if degrade is not None:
        changes["allow_degrade"] = degrade
    if not changes:
        raise typer.BadParameter("nothing to update: pass at least one option")
    _edit(lambda store: store.update(name, **changes), config, database)
    typer.echo(f"updated key {name!r}: {', '.join(sorted(changes))}")


def _ensure_team(config: Path | None, database: str | None, name: str) -> None:
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.usage.teams import TeamStore

    TeamStore(open_database(settings_for(config, database).database)).ensure(name)


def _store(config: Path | None, database: str | None) -> KeyStore:
    from inhouse.gateway.config import ConfigError
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.keys import KeyStore, load_pepper

    settings = settings_for(config, database)
    try:
        pepper = load_pepper(settings)
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    return KeyStore(open_database(settings.database), pepper)


def _edit(change: Any, config: Path | None = None, database: str | None = None) -> None:
    from inhouse.gateway.keys import UnknownKey

    try:
        change(_store(config, database))
    except UnknownKey as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(1) from None
    except ValueError as err:  # a setting the store refuses (an unknown priority class)
        raise typer.BadParameter(str(err)) from None


def _expiry(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return time.time() + parse_period(text)
    except typer.BadParameter:
        try:
            return datetime.fromisoformat(text).astimezone().timestamp()
        except ValueError:
            raise typer.BadParameter(f"--expires: not a duration or ISO date: {text!r}") from None


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _quota(key: ApiKey, now: float) -> str:
    if key.quota_tokens is None:
        return "-"
    return f"{key.quota_used_at(now)}/{key.quota_tokens}"
