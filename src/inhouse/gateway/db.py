"""The gateway's database schema, and bringing an existing database up to it: the columns
and indexes added since it was created (`create_all` makes only missing tables, so without
this a database from an older release would refuse every query that names a new column).
`db_open` opens the connection pool."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy import (
    Boolean,
    Column,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.schema import CreateIndex

metadata = MetaData()

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float),
    Column("revoked_at", Float),
    Column("rpm", Integer),
    Column("tpm", Integer),
    Column("max_concurrent", Integer),
    Column("quota_tokens", Integer),
    Column("quota_period_s", Float),
    Column("quota_window", Integer, nullable=False, default=0),
    Column("quota_used", Integer, nullable=False, default=0),
    Column("models", Text),
    Column("allow_fallback", Boolean, nullable=False, default=True),
    Column("log_content", Boolean, nullable=False, default=False),
    # Added after the first release (nullable, so `migrate` can add them to old databases):
    Column("team", String(200), index=True),
    Column("admin", Boolean),
    # Its priority class (`priority`; NULL: default) and whether it may be degraded to a
    # smaller model under overload (NULL: yes).
    Column("priority", String(16)),
    Column("allow_degrade", Boolean),
    Column("adapters", Text),  # the LoRA adapters it may use (NULL: all; `name_lists`)
    Column("max_images", Integer),  # image parts a request may hold (NULL: the model's limit)
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("ts", Float, nullable=False, index=True),
    Column("key_name", String(200), index=True),
    Column("model", String(200)),
    Column("endpoint", String(64)),
    Column("backend", String(200)),
    Column("status", Integer, nullable=False),
    Column("error_type", String(64)),
    Column("stream", Boolean, nullable=False, default=False),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("reserved_tokens", Integer, nullable=False, default=0),
    Column("latency_ms", Float),
    Column("ttft_ms", Float),
    Column("finish_reason", String(32)),
    Column("fallback_used", Boolean, nullable=False, default=False),
    Column("prompt_text", Text),
    Column("completion_text", Text),
    # Added after the first release (see `migrate`): the key's team at the time, and a
    # peppered hash of the prompt (never its text) to tell a retry from a new task; the
    # release number that answered (see `releases`), and whether a json_schema answer of a
    # model with releases was valid JSON.
    Column("team", String(200)),
    Column("prompt_hash", String(64)),
    Column("release", Integer),
    Column("json_valid", Boolean),
    Column("refusal", Boolean),  # the answer checks (answer_checks), for models with releases
    Column("tool_calls_valid", Boolean),
    # The class the request ran at (after the clamp to its key's), and the model it asked
    # for when a smaller one answered instead (`degrade`).
    Column("priority", String(16)),
    Column("degraded_from", String(200)),
    # The hold its tokens were reserved under (`holds`): replaying a journal row settles a
    # hold its gateway died before settling.
    Column("hold", String(32)),
    # The LoRA adapter asked for (its base model in `model`), NULL for the base model.
    Column("adapter", String(200)),
    Column("images", Integer),  # image parts in the request (never the images themselves)
    # Usage reports scan a time range and group: covering indexes keep them off the table.
    Index(
        "ix_audit_usage",
        *("ts", "key_name", "team", "model", "status", "prompt_tokens", "completion_tokens"),
        "images",
    ),
    Index("ix_audit_retry", "key_name", "prompt_hash", "ts"),
)

# The audit summed per UTC day, key, team and model, kept in the transaction that inserts
# the rows (see `rollup`): a 30-day report reads ~30 rows per group, not every request.
usage_daily = Table(
    "usage_daily",
    metadata,
    Column("day", Integer, primary_key=True),
    Column("key_name", String(200), primary_key=True),  # "" for none, as for team
    Column("team", String(200), primary_key=True),
    Column("model", String(200), primary_key=True),
    Column("requests", Integer, nullable=False),
    Column("errors", Integer, nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("images", Integer),  # image parts the requests held (NULL on rows from before)
)

# Journal segments whose rows are committed: a segment found on disk after a crash and
# named here is deleted, not inserted twice (see `journal`).
audit_segments = Table(
    "audit_segments",
    metadata,
    Column("name", String(64), primary_key=True),
)

# A team's shared token quota and money budget, reserved like a key's quota (`teams`).
teams = Table(
    "teams",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("period_s", Float, nullable=False),
    Column("quota_tokens", Integer),
    Column("budget", Float),
    Column("hard_stop", Boolean, nullable=False, default=True),
    Column("window", Integer, nullable=False, default=0),
    Column("tokens_used", Integer, nullable=False, default=0),
    Column("money_used", Float, nullable=False, default=0.0),
    Column("adapters", Text),  # the LoRA adapters its keys may use (NULL: all; `name_lists`)
)

# What admitted requests hold of their key's quota and their team's quota and budget, until
# settled (`holds`): the owner gateway renews `expires_at`; past it, any gateway returns the
# hold (`released`) and a late settlement then adds the whole charge.
holds = Table(
    "holds",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("owner", String(32), nullable=False, index=True),
    Column("expires_at", Float, nullable=False, index=True),
    Column("at", Float, nullable=False),  # the request's time: the periods it is held in
    Column("key_id", Integer),  # set when the key's quota holds `tokens`
    Column("team", String(200)),  # set when the team holds `tokens` and `money`
    Column("tokens", Integer, nullable=False),
    Column("money", Float, nullable=False),
    Column("released", Boolean, nullable=False, default=False),
)

# One-off steps a database has had, by name (the usage rollup's backfill: `rollup`).
schema_marks = Table(
    "schema_marks",
    metadata,
    Column("name", String(64), primary_key=True),
)

# Console sign-ins (`console.session`): a row per open session, found by a hash of its
# cookie, so logging out on one replica ends it on every replica. It holds the key's
# secret hash at sign-in: rotating the key's secret ends its sessions.
admin_sessions = Table(
    "admin_sessions",
    metadata,
    Column("token_hash", String(64), primary_key=True),
    Column("key_id", Integer, nullable=False, index=True),
    Column("key_hash", String(64), nullable=False),
    Column("expires_at", Float, nullable=False, index=True),
)

limiter_state = Table(
    "limiter_state",
    metadata,
    Column("bucket", String(200), primary_key=True),
    Column("tat", Float, nullable=False),
)

# Releases (see `releases`): numbered, immutable units per public model; one state row per
# model says which release is stable, which is the candidate and its shares, with a version
# that every change bumps; every change is an event.
releases = Table(
    "releases",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("model", String(200), nullable=False),
    Column("number", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("backends", Text, nullable=False),  # JSON: upstream references
    Column("manifest_digest", String(64)),
    Column("manifest", Text),  # JSON: what the manifest pins
    Column("sampling", Text),  # JSON: defaults applied where the client sets none
    Column("max_output", Integer),
    Column("guardrails", Text),  # JSON: thresholds for automatic rollback
    # An adapter's release (`model` is its public name): the adapter version sent upstream.
    Column("adapter", String(200)),
    UniqueConstraint("model", "number"),
)

release_state = Table(
    "release_state",
    metadata,
    Column("model", String(200), primary_key=True),
    Column("version", Integer, nullable=False),
    Column("stable", Integer, nullable=False),
    Column("candidate", Integer),
    Column("percent", Float, nullable=False, default=0.0),
    Column("shadow", Float, nullable=False, default=0.0),
    Column("since", Float, nullable=False),  # when the candidate (or stable) took its place
)

release_events = Table(
    "release_events",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("ts", Float, nullable=False),
    Column("model", String(200), nullable=False, index=True),
    Column("actor", String(200), nullable=False),
    Column("action", String(32), nullable=False),
    Column("release", Integer),
    Column("detail", Text),  # JSON: what changed
    Column("reason", Text),
)

shadow_pairs = Table(
    "shadow_pairs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("ts", Float, nullable=False),
    Column("model", String(200), nullable=False, index=True),
    Column("primary_release", Integer, nullable=False),
    Column("shadow_release", Integer, nullable=False, index=True),
    Column("key_name", String(200)),
    Column("endpoint", String(64)),
    Column("primary_status", Integer, nullable=False),
    Column("shadow_status", Integer, nullable=False),
    Column("shadow_error", String(64)),
    Column("primary_finish", String(32)),
    Column("shadow_finish", String(32)),
    Column("primary_tokens", Integer),
    Column("shadow_tokens", Integer),
    Column("primary_latency_ms", Float),
    Column("shadow_latency_ms", Float),
    Column("primary_ttft_ms", Float),
    Column("shadow_ttft_ms", Float),
    Column("exact_match", Boolean),
    Column("primary_json_valid", Boolean),
    Column("shadow_json_valid", Boolean),
    Column("primary_refusal", Boolean),
    Column("shadow_refusal", Boolean),
    Column("primary_tool_calls_valid", Boolean),
    Column("shadow_tool_calls_valid", Boolean),
    Column("prompt_hash", String(64)),  # the audit's peppered hash: matches eval items
    Column("primary_text", Text),  # only for keys that log content
    Column("shadow_text", Text),
)


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, or None for other databases."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def add_missing(db: Engine, metadata: MetaData) -> None:
    """Add every nullable column and every index of `metadata` that the database lacks.

    Replicas starting together may race to add the same one: a loser's error is ignored
    when a fresh look finds the column or index there."""
    for table in metadata.sorted_tables:
        for column in table.columns:
            if column.name in _columns(db, table.name):
                continue
            if not column.nullable:
                raise RuntimeError(f"{table.name}.{column.name} must be nullable to be added")
            kind = column.type.compile(db.dialect)
            ddl = f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'
            _run(db, ddl, lambda t=table.name, c=column.name: c in _columns(db, t))
        for index in table.indexes:
            if index.name not in _indexes(db, table.name):
                ddl = str(CreateIndex(index).compile(dialect=db.dialect))
                _run(db, ddl, lambda t=table.name, n=index.name: n in _indexes(db, t))


def _columns(db: Engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(db).get_columns(table)}


def _indexes(db: Engine, table: str) -> set[str | None]:
    return {i["name"] for i in inspect(db).get_indexes(table)}


def _run(db: Engine, ddl: str, done_elsewhere: Callable[[], bool]) -> None:
    try:
        with db.begin() as conn:
            conn.execute(text(ddl))
    except (OperationalError, ProgrammingError):
        if not done_elsewhere():
            raise
