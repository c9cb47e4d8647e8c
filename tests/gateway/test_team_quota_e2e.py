"""Issue 43: a team's quota and money budget hold across two gateway replicas on one real
PostgreSQL when its keys have no limits of their own, and a gateway SIGKILLed mid-burst
leaves no drift: after its restart `quota_used` and the team's usage equal the audit's
charges.

Two `inhouse gateway` processes (`shared_limits`, holds that expire 2 s after their gateway
stops renewing them) in front of the metered upstream, whose every reply costs exactly what
its `/tokenize` counted plus all of `max_tokens`: each request's estimate error is 0, so the
bound a team must hold is its quota itself. The prompt is one its characters/4 estimate
puts at 54 tokens where it costs 108: reserved with the estimate (the bug), 80 chats put
4,830 tokens on a quota of 3,000.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from metered_upstream import MODEL, metered_upstream, prompt_tokens
from sqlalchemy import Engine, func, select

from inhouse.gateway.db import audit_log, holds
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore
from inhouse.gateway.usage.teams import TeamStore
from serving import Process, free_port, gateway_toml, inhouse_command

pytest.importorskip("psycopg", reason="pip install -e '.[dev]' (psycopg[binary])")

pytestmark = pytest.mark.slow

DAY = 86400.0
MAX_TOKENS = 30
CHATS = 80
MESSAGES = [{"role": "user", "content": "Summarise this. " + "=" * 184}]  # 200 bytes
PRICES = (1.0, 2.0)  # money per prompt token, per completion token
COST = prompt_tokens(MESSAGES) + MAX_TOKENS  # tokens each chat really costs, and money:
MONEY = prompt_tokens(MESSAGES) * PRICES[0] + MAX_TOKENS * PRICES[1]


@dataclass
class Stack:
    urls: list[str]
    gateways: list[Process]
    db_url: str
    db: Engine
    keys: KeyStore
    teams: TeamStore


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, postgres: str) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("team-quota")
    pepper = base / "pepper"
    pepper.write_text(secrets.token_hex(32))
    ports = [free_port() for _ in range(2)]
    with metered_upstream() as upstream:
        backend = {"name": "metered", "url": upstream, "model": MODEL, "kind": "vllm",
                   "capabilities": ["chat"], "max_context": 4096}  # fmt: skip
        gateways = []
        for i, port in enumerate(ports):
            config = base / f"gateway-{i}.toml"
            config.write_text(
                gateway_toml(
                    {"port": port, "database": postgres, "pepper_file": pepper,
                     "shared_limits": True, "hold_ttl_s": 2},
                    [{"name": "m", "backends": [backend]}],
                    health={"interval_s": 1},
                    audit={"flush_interval_s": 0.2, "journal_dir": base / f"journal-{i}"},
                    cost={"hosted": {"input_per_million": PRICES[0] * 1e6,
                                     "output_per_million": PRICES[1] * 1e6}},
                )
            )  # fmt: skip
            args = [*inhouse_command(), "gateway", "--config", str(config)]
            gateways.append(Process(args, base / f"gateway-{i}.log"))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        db = open_database(postgres)
        try:
            for proc, url in zip(gateways, urls, strict=True):
                proc.start()
                proc.wait_healthy(f"{url}/health", 60)
            keys = KeyStore(db, pepper.read_text().encode())
            yield Stack(urls, gateways, postgres, db, keys, TeamStore(db))
        finally:
            for proc in gateways:
                proc.stop()
            db.dispose()


def chats(
    urls: list[str], secrets_: list[str], n: int, spacing_s: float = 0.0
) -> list[tuple[int, str | None]]:
    """`n` chats at once (or one every `spacing_s`), call i to urls[i % 2] with key
    secrets_[i % len]; (status, error code) of each, status 0 when the connection broke."""

    async def run() -> list[tuple[int, str | None]]:
        clients = {
            (url, secret): openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)
            for url in urls
            for secret in secrets_
        }

        async def one(i: int) -> tuple[int, str | None]:
            await asyncio.sleep(i * spacing_s)
            client = clients[(urls[i % len(urls)], secrets_[i % len(secrets_)])]
            try:
                await client.chat.completions.create(
                    model="m", messages=MESSAGES, max_tokens=MAX_TOKENS
                )
                return 200, None
            except openai.APIStatusError as err:
                return err.status_code, err.code
            except openai.APIConnectionError:
                return 0, None

        try:
            return await asyncio.gather(*(one(i) for i in range(n)))
        finally:
            for client in clients.values():
                await client.close()

    return asyncio.run(run())


def audit_charges(db: Engine, names: list[str]) -> tuple[int, int, float]:
    """Rows, tokens and money the audit holds for these keys."""
    c = audit_log.c
    query = select(func.count(), func.sum(c.prompt_tokens), func.sum(c.completion_tokens))
    with db.connect() as conn:
        rows, prompt, completion = conn.execute(query.where(c.key_name.in_(names))).one()
    prompt, completion = prompt or 0, completion or 0
    return rows, prompt + completion, prompt * PRICES[0] + completion * PRICES[1]


def hold_counts(db: Engine, team: str) -> tuple[int, int]:
    """The team's live holds, and those returned after their gateway died."""
    c = holds.c
    query = select(c.released, func.count()).where(c.team == team).group_by(c.released)
    with db.connect() as conn:
        counts = dict(conn.execute(query).all())
    return counts.get(False, 0), counts.get(True, 0)


def settled(stack: Stack, team: str, names: list[str], rows: int, timeout: float = 20) -> None:
    """Wait until the keys have `rows` audit rows and the team no live hold."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if audit_charges(stack.db, names)[0] >= rows and hold_counts(stack.db, team)[0] == 0:
            return
        time.sleep(0.1)
    pytest.fail(f"not settled: {audit_charges(stack.db, names)}, {hold_counts(stack.db, team)}")


@pytest.mark.parametrize("limit", ["quota_tokens", "budget"])
def test_a_team_limit_holds_across_replicas_for_keys_without_limits(
    stack: Stack, limit: str
) -> None:
    team = f"team-{limit}"
    price = COST if limit == "quota_tokens" else MONEY
    stack.teams.create(team, DAY, **{limit: 3000 if limit == "quota_tokens" else 3000.0})
    names = [f"{team}-{i}" for i in range(4)]
    keys = [stack.keys.create(name, team=team)[1] for name in names]  # no limits of their own
    results = chats(stack.urls, keys, CHATS)
    admitted = sum(status == 200 for status, _ in results)
    assert {r for r in results if r[0] != 200} == {(429, "insufficient_quota")}
    settled(stack, team, names, CHATS)
    _, tokens, money = audit_charges(stack.db, names)
    used = stack.teams.get(team).used_at(time.time())
    print(f"\n{limit}: {admitted} of {CHATS} admitted, tokens {tokens} ({used[0]}),"
          f" money {money:.1f} ({used[1]:.1f}) of 3000")  # fmt: skip
    # Reservations are exact (the count /tokenize gave, plus max_tokens): the limit admits
    # every chat that fits it, and not one more.
    assert admitted == int(3000 // price)
    assert (tokens, money) == (admitted * COST, pytest.approx(admitted * MONEY))
    assert used == (tokens, pytest.approx(money))
    assert (tokens if limit == "quota_tokens" else money) <= 3000


def test_a_gateway_killed_mid_burst_leaves_no_token_drift(stack: Stack) -> None:
    team, name = "killed", "killed-key"
    stack.teams.create(team, DAY, quota_tokens=10_000_000)
    secret = stack.keys.create(name, quota_tokens=10_000_000, quota_period_s=DAY, team=team)[1]
    answered = returned = 0
    for kill in range(3):
        outcome: list[tuple[int, str | None]] = []
        burst = threading.Thread(
            target=lambda out=outcome: out.extend(
                chats(stack.urls, [secret], CHATS, spacing_s=0.01)
            )
        )
        burst.start()
        deadline = time.monotonic() + 30  # until chats are both in flight and answered
        while time.monotonic() < deadline and not (
            hold_counts(stack.db, team)[0] >= 10 and audit_charges(stack.db, [name])[0] > answered
        ):
            time.sleep(0.02)
        stack.gateways[0].kill()
        burst.join()
        broken = sum(status == 0 for status, _ in outcome)
        answered += CHATS - broken
        assert broken > 0 and {s for s, _ in outcome} <= {0, 200}, "killed mid-burst"
        proc = stack.gateways[0]
        proc.log = proc.log.with_name(f"gateway-0-restart-{kill}.log")
        proc.start()
        proc.wait_healthy(f"{stack.urls[0]}/health", 60)
        settled(stack, team, [name], answered)
        rows, charged, _ = audit_charges(stack.db, [name])
        quota_used = stack.keys.get(name).quota_used_at(time.time())
        team_used = stack.teams.get(team).used_at(time.time())[0]
        returned, before = hold_counts(stack.db, team)[1], returned
        print(f"\nkill {kill + 1}: {broken} chats cut off, {returned - before} holds returned;"
              f" audit {charged} tokens in {rows} rows, quota_used {quota_used},"
              f" team {team_used}")  # fmt: skip
        assert quota_used == charged == team_used
        assert returned > before, "the killed gateway's holds were returned"
