"""One real `inhouse serve` (bundled chat and embedding models) and one real `inhouse
gateway` in front of it with a key: what the edge tests and `benchmarks/hostile_suite.py`
run against."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from inhouse.server.serve import DEFAULT_EMBEDDING_NAME
from serving import Process, free_port, gateway_toml, inhouse_command

CHAT_MODEL = "SmolLM2-135M-Instruct"
STARTUP_TIMEOUT_S = 300


@dataclass(frozen=True)
class Target:
    """A server under test: its URL, the key it takes and the model names it routes."""

    name: str
    url: str
    key: str
    chat_model: str
    embedding_model: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@dataclass(frozen=True)
class Edges:
    serve: Target
    gateway: Target
    serve_log: Path
    gateway_log: Path
    serve_pid: int
    keys: KeyStore  # the gateway's: more keys for a test that needs them


def _gateway_config(port: int, db_url: str, serve_url: str, serve_key: str) -> str:
    chat_caps = ["chat", "completions", "tools", "json_schema", "vision"]
    models = [
        {"name": name, "backends": [{"name": f"{name}-1", "url": serve_url, "api_key": serve_key,
                                     "model": model, "capabilities": caps}]}
        for name, model, caps in (
            ("smol", CHAT_MODEL, chat_caps),
            ("minilm", DEFAULT_EMBEDDING_NAME, ["embeddings"]),
        )
    ]  # fmt: skip
    return gateway_toml(
        {"port": port, "database": db_url}, models, health={"interval_s": 5, "timeout_s": 30}
    )


@contextmanager
def running_edges(
    base: Path,
    max_model_len: int,
    kv_cache_memory: str,
    max_num_seqs: int = 32,
    model: str | None = None,
) -> Iterator[Edges]:
    """Start serve (on `model`, served under the bundled model's name; None: the bundled
    model) and the gateway (logs and database in `base`), yield them, stop them."""
    serve_key = secrets.token_urlsafe(24)
    serve_port, gateway_port = free_port(), free_port()
    serve_url = f"http://127.0.0.1:{serve_port}"
    serve = Process(
        [*inhouse_command(), "serve", "--port", str(serve_port), "--max-model-len",
         str(max_model_len), "--kv-cache-memory", kv_cache_memory, "--max-num-seqs",
         str(max_num_seqs), *([model, "--served-model-name", CHAT_MODEL] if model else [])],
        base / "serve.log",
        {"INHOUSE_API_KEY": serve_key},
    )  # fmt: skip
    db_url = f"sqlite:///{base / 'gateway.db'}"
    config_path = base / "inhouse.toml"
    config_path.write_text(_gateway_config(gateway_port, db_url, serve_url, serve_key))
    gateway = Process(
        [*inhouse_command(), "gateway", "--config", str(config_path)], base / "gateway.log"
    )
    try:
        serve.start()
        serve.wait_healthy(f"{serve_url}/health", STARTUP_TIMEOUT_S)
        gateway.start()
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        gateway.wait_healthy(f"{gateway_url}/health", 60)
        store = KeyStore(open_database(db_url), load_pepper(load_config(config_path)))
        _, secret = store.create("edges")
        assert serve.popen is not None
        yield Edges(
            Target("serve", serve_url, serve_key, CHAT_MODEL, DEFAULT_EMBEDDING_NAME),
            Target("gateway", gateway_url, secret, "smol", "minilm"),
            serve.log,
            gateway.log,
            serve.popen.pid,
            store,
        )
    finally:
        gateway.stop()
        serve.stop()
