"""`benchmarks/fair_share.py`'s scenarios through `inhouse gateway`, with keys of two classes.

Starts one `inhouse serve` (bundled model, ``--scheduling-policy`` as given) and a gateway
in front of it on a fresh SQLite file, creates an interactive key and two batch keys, and
runs fair_share.py against the gateway with ``--tenancy keys``: the bodies carry neither
tenant nor priority, so the gateway's class (sent upstream as vLLM's ``priority``) and
its per-key cache salt (the engine's tenant) are what the engine schedules by.

    .venv/bin/python benchmarks/fair_share_gateway.py [--policy fair] [-- fair_share flags]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from knee_prediction import inhouse
from vs_llamacpp import free_port, stop, wait_ready

MODEL = "smol"


def gateway_config(tmp: Path, gateway_port: int, serve_port: int) -> Path:
    """A gateway that never queues or limits the benchmark's requests itself."""
    config = tmp / "inhouse.toml"
    config.write_text(
        f'[gateway]\nport = {gateway_port}\ndatabase = "sqlite:///{tmp / "gateway.db"}"\n'
        f'access_log = false\n[[models]]\nname = "{MODEL}"\nqueue_max_depth = 256\n'
        f'[[models.backends]]\nname = "serve"\nurl = "http://127.0.0.1:{serve_port}"\n'
        f'model = "SmolLM2-135M-Instruct"\nkind = "inhouse"\nmax_in_flight = 256\n'
    )
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="fair", help="the engine's --scheduling-policy")
    parser.add_argument("--max-model-len", default="2048")
    parser.add_argument("--kv-cache-memory", default="768MiB")
    args, rest = parser.parse_known_args()
    rest = [a for a in rest if a != "--"]
    with tempfile.TemporaryDirectory(prefix="fair-gateway-") as tmp_name:
        tmp = Path(tmp_name)
        serve_port, gateway_port = free_port(), free_port()
        config = gateway_config(tmp, gateway_port, serve_port)
        serve = [inhouse(), "serve", "--port", str(serve_port), "--embedding-model", "none",
                 "--scheduling-policy", args.policy, "--max-model-len", args.max_model_len,
                 "--kv-cache-memory", args.kv_cache_memory]  # fmt: skip
        procs = [subprocess.Popen(serve)]
        procs.append(subprocess.Popen([inhouse(), "gateway", "--config", str(config)]))
        try:
            wait_ready(f"http://127.0.0.1:{serve_port}/health", procs[0], 600)
            wait_ready(f"http://127.0.0.1:{gateway_port}/health", procs[1], 60)
            settings = load_config(config)
            store = KeyStore(open_database(settings.database), load_pepper(settings))
            keys = {
                name: store.create(name, priority=cls)[1]
                for name, cls in (("chat", "interactive"), ("etl", "batch"), ("etl2", "batch"))
            }
            bench = [sys.executable, str(Path(__file__).with_name("fair_share.py")),
                     "--base-url", f"http://127.0.0.1:{gateway_port}", "--model", MODEL,
                     "--tenancy", "keys", "--interactive-key", keys["chat"],
                     "--batch-key", keys["etl"], "--batch-key-2", keys["etl2"], *rest]  # fmt: skip
            print(f"through the gateway; engine --scheduling-policy {args.policy}", flush=True)
            subprocess.run(bench, check=True)
        finally:
            for proc in procs:
                stop(proc)


if __name__ == "__main__":
    main()
