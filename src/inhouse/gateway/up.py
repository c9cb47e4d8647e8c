"""`inhouse up`: one `inhouse serve` on a private loopback port behind the gateway.

The backend gets a random key that only the gateway knows (passed through the
environment, so it never shows in `ps`); the first start creates an `admin` key and
prints its secret once.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from inhouse.gateway.config import GatewayConfig

ADMIN_KEY = "admin"
EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"  # the name `inhouse serve` gives its bundled embedder
CHAT_FEATURES = ("chat", "completions", "tools", "json_schema")


def up_command(
    model: Annotated[
        str | None, typer.Argument(help="HF folder or GGUF file; omit for bundled SmolLM2.")
    ] = None,
    host: Annotated[str, typer.Option(help="Gateway address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000,
    database: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL (default: SQLite in $INHOUSE_HOME).")
    ] = None,
    embeddings: Annotated[
        bool, typer.Option(help="Also serve the bundled embedding model.")
    ] = True,
) -> None:
    """Start a model server and the gateway in front of it on http://127.0.0.1:8000."""
    from inhouse.gateway.config import default_database_url
    from inhouse.gateway.serve import run_gateway

    backend_port = free_port()
    backend_key = secrets.token_urlsafe(32)
    chat_name = served_name(model)
    backend = start_backend(model, chat_name, backend_port, backend_key, embeddings)
    try:
        config = up_config(
            chat_name,
            f"http://127.0.0.1:{backend_port}",
            backend_key,
            host,
            port,
            database or default_database_url(),
            embeddings,
        )
        secret = ensure_admin_key(config)
        if secret is not None:
            typer.echo(f"Created the '{ADMIN_KEY}' key; its secret is shown only now:\n{secret}")
        typer.echo(
            f"Gateway on http://{host}:{port}/v1 in front of model {chat_name!r}"
            " (loading; /health shows progress)"
        )
        run_gateway(config)
    finally:
        backend.terminate()
        try:
            backend.wait(timeout=10)
        except subprocess.TimeoutExpired:
            backend.kill()


def served_name(model: str | None) -> str:
    from inhouse.bundled import DEFAULT_CHAT_MODEL_NAME

    if model is None:
        return DEFAULT_CHAT_MODEL_NAME
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


def free_port() -> int:
    """A loopback port nobody is listening on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def inhouse_command() -> list[str]:
    """How to run the `inhouse` CLI of this very installation."""
    script = Path(sys.executable).with_name("inhouse")
    if script.exists():
        return [str(script)]
    found = shutil.which("inhouse")
    return [found] if found else [sys.executable, "-c", "from inhouse.cli import main; main()"]


def start_backend(
    model: str | None, name: str, port: int, key: str, embeddings: bool
) -> subprocess.Popen[bytes]:
    args = [*inhouse_command(), "serve", *([model] if model else [])]
    args += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", name]
    if not embeddings:
        args += ["--embedding-model", "none"]
    return subprocess.Popen(args, env={**os.environ, "INHOUSE_API_KEY": key})


def up_config(
    chat_name: str,
    url: str,
    backend_key: str,
    host: str,
    port: int,
    database: str,
    embeddings: bool,
) -> GatewayConfig:
    """The gateway config `inhouse up` runs with: one backend, queue policy."""
    from inhouse.gateway.config import parse_config

    backend = {"name": "local", "url": url, "api_key": backend_key, "kind": "inhouse"}
    models = [{"name": chat_name, "backends": [{**backend, "capabilities": list(CHAT_FEATURES)}]}]
    if embeddings:
        models.append(
            {
                "name": EMBEDDING_MODEL_NAME,
                "backends": [{**backend, "capabilities": ["embeddings"]}],
            }
        )
    return parse_config(
        {"gateway": {"host": host, "port": port, "database": database}, "models": models}
    )


def ensure_admin_key(config: GatewayConfig) -> str | None:
    """Create the admin key on first start; returns its secret then, else None."""
    from inhouse.gateway.db import open_database
    from inhouse.gateway.keys import KeyStore, load_pepper

    store = KeyStore(open_database(config.database), load_pepper(config))
    if any(k.name == ADMIN_KEY for k in store.list()):
        return None
    _, secret = store.create(ADMIN_KEY)
    return secret
