"""The keep-alive race: clients whose pooled connection sat idle just under their pool's
expiry send their next chat through the gateway; count the chats that fail on the client's
side before any answer (issue 43).

Method (everything on 127.0.0.1): the canned upstream of the tests, a real `inhouse gateway`
process before it (SQLite), `--clients` official `openai.AsyncOpenAI` clients (default pool:
idle connections kept 5 s), each sending `--rounds` short chats with a pause drawn uniformly
from `--idle-lo`..`--idle-hi` seconds between them (no retries). The gateway runs with
`keep_alive_s = --keep-alive` (0: its default). Each failure's exception chain is printed;
the gateway's access-log lines for the chats count the requests that reached it.

    .venv/bin/python benchmarks/keep_alive_race.py --keep-alive 5   # uvicorn's default
    .venv/bin/python benchmarks/keep_alive_race.py                  # the gateway's default
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "gateway")]

from canned_upstream import canned_upstream  # noqa: E402
from gateway_under_test import TOKEN_ENV, start_gateway  # noqa: E402

from serving import exception_chain  # noqa: E402

HELLO = [{"role": "user", "content": "hi"}]


async def chats(url: str, secret: str, args: argparse.Namespace) -> tuple[int, list[str]]:
    """Chats answered, and each failure's description."""
    answered, failures = 0, []

    async def one() -> None:
        nonlocal answered
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)
        try:
            for round_ in range(args.rounds):
                if round_:
                    await asyncio.sleep(random.uniform(args.idle_lo, args.idle_hi))
                try:
                    await client.chat.completions.create(model="m", messages=HELLO, max_tokens=2)
                    answered += 1
                except openai.APIConnectionError as err:
                    failures.append(exception_chain(err))
                except openai.APIStatusError as err:
                    failures.append(f"status {err.status_code}")
        finally:
            await client.close()

    await asyncio.gather(*(one() for _ in range(args.clients)))
    return answered, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-alive", type=float, default=0.0, help="0: the gateway's default")
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--idle-lo", type=float, default=4.9)
    parser.add_argument("--idle-hi", type=float, default=5.0)
    args = parser.parse_args()
    os.environ.setdefault(TOKEN_ENV, "keep-alive-race-metrics-token")
    extra = {"keep_alive_s": args.keep_alive} if args.keep_alive else None
    with tempfile.TemporaryDirectory() as base, canned_upstream() as canned:
        gateway = start_gateway(Path(base), canned, extra)
        try:
            started = time.monotonic()
            answered, failures = asyncio.run(chats(gateway.url, gateway.key("racer"), args))
            took = time.monotonic() - started
        finally:
            gateway.process.stop()
        log = gateway.process.log.read_text().splitlines()
    reached = sum('"POST /v1/chat/completions' in line for line in log)
    print(
        f"keep_alive_s {args.keep_alive or 'default'}: {answered} answered, {len(failures)} "
        f"failed of {args.clients * args.rounds} chats ({args.clients * (args.rounds - 1)} "
        f"after {args.idle_lo}-{args.idle_hi} s idle); {reached} reached the gateway; "
        f"{took:.0f} s, load {os.getloadavg()[0]:.1f}"
    )
    for failure in failures:
        print("  ", failure)


if __name__ == "__main__":
    main()
