"""The console's sessions and text fields against real `inhouse gateway` processes in front
of the canned upstream: two replicas on one real PostgreSQL (one pepper, `shared_limits`),
one on SQLite.

Logout on one replica, a revoke, a demotion and a new secret each end an open session on
the next request of both replicas; NUL and bytes that are not UTF-8 in every `/admin` filter
and form are a 400 in OpenAI's shape on both databases, never a 5xx, and the next request
is served; the session cookie is Secure when a trusted proxy says the client came over
HTTPS, and only then."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from admin_fields import attempts
from canned_upstream import Canned
from gateway_under_test import TOKEN_ENV, gateway_config

from inhouse.gateway.config import GatewayConfig
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from serving import Process, free_port, inhouse_command

pytest.importorskip("psycopg", reason="pip install -e '.[dev]' (psycopg[binary])")

pytestmark = pytest.mark.slow

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
FORM = {"content-type": "application/x-www-form-urlencoded"}


@dataclass
class Stack:
    """Gateways over one database and the key store they share."""

    urls: list[str]
    store: KeyStore
    processes: list[Process] = field(default_factory=list)


def _start(base: Path, canned: Canned, db_url: str, extras: list[dict[str, object]]) -> Stack:
    pepper = base / "pepper"
    pepper.write_text(secrets.token_hex(32))
    processes, urls = [], []
    for i, extra in enumerate(extras):
        port = free_port()
        config = base / f"gateway-{i}.toml"
        settings = {"pepper_file": pepper, "shared_limits": True, **extra}
        config.write_text(gateway_config(port, db_url, canned.url, "backend-key", settings))
        args = [*inhouse_command(), "gateway", "--config", str(config)]
        processes.append(Process(args, base / f"gateway-{i}.log", {TOKEN_ENV: "metrics"}))
        urls.append(f"http://127.0.0.1:{port}")
    for process in processes:
        process.start()
    for process, url in zip(processes, urls, strict=True):
        process.wait_healthy(f"{url}/health", 60)
    settings = GatewayConfig(models=(), database=db_url, pepper_file=pepper)
    return Stack(urls, KeyStore(open_database(db_url), load_pepper(settings)), processes)


@pytest.fixture(scope="module")
def stacks(
    tmp_path_factory: pytest.TempPathFactory, canned: Canned, postgres: str
) -> Iterator[dict[str, Stack]]:
    """`postgresql`: two replicas, the first trusting 127.0.0.1 as its TLS proxy; `sqlite`:
    one gateway."""
    base = tmp_path_factory.mktemp("console-replicas")
    (base / "pg").mkdir()
    (base / "sqlite").mkdir()
    built = {}
    try:
        built["postgresql"] = _start(base / "pg", canned, postgres,
                                     [{"trusted_proxies": ["127.0.0.1"]}, {}])  # fmt: skip
        built["sqlite"] = _start(base / "sqlite", canned,
                                 f"sqlite:///{base / 'sqlite' / 'gateway.db'}", [{}])  # fmt: skip
        yield built
    finally:
        for stack in built.values():
            for process in stack.processes:
                process.stop()


def _sign_in(url: str, secret: str, headers: dict[str, str] | None = None) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as client:
        page = client.get("/admin/login")
        token = CSRF.search(page.text)
        assert token is not None
        return client.post("/admin/login", data={"csrf": token.group(1), "key": secret},
                           headers=headers)  # fmt: skip


def _session(url: str, secret: str) -> str:
    answer = _sign_in(url, secret)
    assert answer.status_code == 303, answer.text
    return answer.cookies["ih_session"]


def _statuses(stack: Stack, cookie: str) -> list[int]:
    """What a keys page and the usage API answer the session on each replica."""
    jar = {"ih_session": cookie}
    return [
        httpx.get(f"{url}{path}", cookies=jar, timeout=30).status_code
        for url in stack.urls
        for path in ("/admin/keys", "/admin/api/usage")
    ]


def _csrf(url: str, cookie: str) -> str:
    page = httpx.get(f"{url}/admin/keys", cookies={"ih_session": cookie}, timeout=30)
    found = CSRF.search(page.text)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("end", ["logout", "revoke", "demote", "rotate"])
def test_each_end_of_a_session_applies_on_the_next_request_of_both_replicas(
    stacks: dict[str, Stack], end: str
) -> None:
    stack = stacks["postgresql"]
    name = f"ops-{end}"
    cookie = _session(stack.urls[0], stack.store.create(name, admin=True)[1])
    assert _statuses(stack, cookie) == [200, 200, 200, 200]
    if end == "logout":  # on the other replica than the sign-in
        out = httpx.post(f"{stack.urls[1]}/admin/logout", cookies={"ih_session": cookie},
                         data={"csrf": _csrf(stack.urls[1], cookie)}, timeout=30)  # fmt: skip
        assert out.status_code == 303
    elif end == "revoke":
        stack.store.revoke(name)
    elif end == "demote":
        stack.store.update(name, admin=False)
    else:
        stack.store.rotate(name)
    assert _statuses(stack, cookie) == [303, 401, 303, 401]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_hostile_bytes_in_every_admin_filter_and_form_are_a_400_never_a_5xx(
    stacks: dict[str, Stack], database: str
) -> None:
    stack = stacks[database]
    cookie = _session(stack.urls[0], stack.store.create("ops-fields", admin=True)[1])
    tried = attempts(_csrf(stack.urls[0], cookie))
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=stack.urls[0], cookies={"ih_session": cookie}, timeout=30) as http:
        for attempt in tried:
            answer = http.request(attempt.method, attempt.path, content=attempt.body,
                                  headers=FORM)  # fmt: skip
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            assert answer.status_code == 400, (attempt, answer.text)
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "invalid_text", attempt
        for path in ("/admin/audit?team=search", "/admin/usage?person=ops", "/admin/keys"):
            assert http.get(path).status_code == 200, path  # the connection still serves
    assert statuses == {400: len(tried)} and len(tried) >= 300
    print(f"{database}: {len(tried)} hostile admin requests -> {statuses}")


def test_the_cookie_is_secure_when_a_trusted_proxy_says_https(stacks: dict[str, Stack]) -> None:
    stack = stacks["postgresql"]  # replica 0 trusts 127.0.0.1 as its proxy, replica 1 not
    secret = stack.store.create("ops-tls", admin=True)[1]
    https = {"x-forwarded-proto": "https"}
    flags = []
    for url in stack.urls:
        answer = _sign_in(url, secret, https)
        cookie = next(c for c in answer.headers.get_list("set-cookie") if "ih_session=" in c)
        flags.append("secure" in {part.strip().lower() for part in cookie.split(";")})
    assert flags == [True, False]
