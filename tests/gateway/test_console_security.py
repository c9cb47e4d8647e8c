"""The admin console's guards, in process over ASGI with the real app and SQLite: no session
→ sign-in page or 401, a normal key → 403, forms without their CSRF token or from another
origin → 403, the cookie's flags, the login rate limit, revocation, demotion, logout and a
new secret each ending a session, hostile bytes in every filter and form refused before the
database, and no secret on any page or in any log."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from admin_fields import attempts

from inhouse.gateway.app import build_gateway, create_app
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.console.session import LOGINS_PER_MINUTE
from inhouse.gateway.handler import Gateway
from inhouse.gateway.keys import AuthError

PAGES = ("/admin", "/admin/keys", "/admin/teams", "/admin/usage", "/admin/usage.svg",
         "/admin/cost", "/admin/audit", "/admin/health")  # fmt: skip
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _run(
    tmp_path: Path, test: Callable[[Gateway, httpx.AsyncClient], Awaitable[None]],
    base_url: str = "http://gw",
) -> None:  # fmt: skip
    config = parse_config({
        "gateway": {"database": f"sqlite:///{tmp_path / 'gateway.db'}"},
        "models": [{"name": "m", "backends": [{"url": "http://127.0.0.1:9"}]}],
    })  # fmt: skip
    gateway = build_gateway(config)

    async def main() -> None:
        transport = httpx.ASGITransport(create_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            await test(gateway, client)

    asyncio.run(main())


async def sign_in(client: httpx.AsyncClient, secret: str) -> httpx.Response:
    page = await client.get("/admin/login")
    token = CSRF.search(page.text)
    assert token is not None
    return await client.post("/admin/login", data={"csrf": token.group(1), "key": secret})


async def csrf_of(client: httpx.AsyncClient, path: str = "/admin/keys") -> str:
    found = CSRF.search((await client.get(path)).text)
    assert found is not None
    return found.group(1)


def test_without_a_session_pages_send_to_sign_in_and_the_api_answers_401(
    tmp_path: Path,
) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        for path in PAGES:
            answer = await client.get(path)
            assert (answer.status_code, answer.headers["location"]) == (303, "/admin/login")
        answer = await client.get("/admin/api/usage")
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
        posted = await client.post("/admin/keys", data={"name": "mallory"})
        assert posted.status_code == 303
        assert "mallory" not in {k.name for k in gateway.keys.list()}
        client.cookies.set("ih_session", "1.9999999999.x." + "0" * 64, path="/admin")
        assert (await client.get("/admin")).status_code == 303  # a forged signature

    _run(tmp_path, test)


def test_a_normal_key_gets_403_from_the_sign_in_and_the_api(tmp_path: Path) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, secret = gateway.keys.create("alice")
        refused = await sign_in(client, secret)
        assert refused.status_code == 403 and "ih_session" not in refused.headers.get(
            "set-cookie", ""
        )
        api = await client.get("/admin/api/usage", headers={"authorization": f"Bearer {secret}"})
        assert api.status_code == 403 and api.json()["error"]["type"] == "permission_error"
        wrong = await sign_in(client, "ih-not-a-key")
        assert wrong.status_code == 401

    _run(tmp_path, test)


def test_forms_without_the_csrf_token_or_from_another_site_are_refused(tmp_path: Path) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, admin = gateway.keys.create("ops", admin=True)
        assert (await sign_in(client, admin)).status_code == 303
        token = await csrf_of(client)
        no_token = await client.post("/admin/keys", data={"name": "x1"})
        wrong_token = await client.post("/admin/keys", data={"name": "x2", "csrf": "0" * 64})
        other_site = await client.post(
            "/admin/keys", data={"name": "x3", "csrf": token},
            headers={"origin": "http://evil.example"},
        )  # fmt: skip
        assert [r.status_code for r in (no_token, wrong_token, other_site)] == [403, 403, 403]
        assert not {"x1", "x2", "x3"} & {k.name for k in gateway.keys.list()}
        revoke = await client.post("/admin/keys/revoke", data={"name": "ops"})
        assert revoke.status_code == 403 and gateway.keys.get("ops").revoked_at is None
        made = await client.post("/admin/keys", data={"name": "x4", "csrf": token},
                                 headers={"origin": "http://gw"})  # fmt: skip
        assert made.status_code == 201
        login_without_token = await client.post("/admin/login", data={"key": admin})
        assert login_without_token.status_code == 403

    _run(tmp_path, test)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_session_cookie_is_httponly_strict_expiring_and_secure_over_tls(
    tmp_path: Path, scheme: str
) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, admin = gateway.keys.create("ops", admin=True)
        answer = await sign_in(client, admin)
        cookie = next(c for c in answer.headers.get_list("set-cookie") if "ih_session=" in c)
        flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert {"httponly", "max-age", "path"} <= flags
        assert "samesite=strict" in cookie.lower() and "Max-Age=28800" in cookie
        assert ("secure" in flags) == (scheme == "https")
        assert admin not in cookie

    _run(tmp_path, test, f"{scheme}://gw")


def test_revoking_the_admin_key_ends_its_session_and_logins_are_rate_limited(
    tmp_path: Path,
) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, admin = gateway.keys.create("ops", admin=True)
        await sign_in(client, admin)
        assert (await client.get("/admin/keys")).status_code == 200
        gateway.keys.revoke("ops")
        assert (await client.get("/admin/keys")).status_code == 303
        statuses = [(await sign_in(client, "ih-guess")).status_code
                    for _ in range(LOGINS_PER_MINUTE + 2)]  # fmt: skip
        assert statuses[: LOGINS_PER_MINUTE - 1] == [401] * (LOGINS_PER_MINUTE - 1)
        assert statuses[-1] == 429

    _run(tmp_path, test)


@pytest.mark.parametrize("end", ["logout", "demote", "rotate"])
def test_logout_demotion_and_a_new_secret_each_end_the_open_session(
    tmp_path: Path, end: str
) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, admin = gateway.keys.create("ops", admin=True)
        await sign_in(client, admin)
        cookie = client.cookies["ih_session"]
        assert (await client.get("/admin/keys")).status_code == 200
        if end == "logout":
            out = await client.post("/admin/logout", data={"csrf": await csrf_of(client)})
            assert out.status_code == 303
        elif end == "demote":
            gateway.keys.update("ops", admin=False)
        else:
            form = {"name": "ops", "csrf": await csrf_of(client)}
            made = await client.post("/admin/keys/rotate", data=form)
            new = re.search(r'<code id="secret">([^<]+)</code>', made.text)
            assert made.status_code == 201 and new is not None
            assert gateway.keys.authenticate(new.group(1)).name == "ops"
            with pytest.raises(AuthError):
                gateway.keys.authenticate(admin)
        client.cookies.set("ih_session", cookie, path="/admin")  # the old cookie, kept
        assert (await client.get("/admin/keys")).status_code == 303
        assert (await client.get("/admin/api/usage")).status_code == 401

    _run(tmp_path, test)


def test_nul_and_bytes_that_are_not_utf8_in_any_filter_or_form_are_a_400(tmp_path: Path) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, admin = gateway.keys.create("ops", admin=True)
        await sign_in(client, admin)
        form = {"content-type": "application/x-www-form-urlencoded"}
        for attempt in attempts(await csrf_of(client)):
            answer = await client.request(attempt.method, attempt.path, content=attempt.body,
                                          headers=form)  # fmt: skip
            assert answer.status_code == 400, attempt
            assert answer.json()["error"]["code"] == "invalid_text", attempt
        assert {k.name for k in gateway.keys.list()} == {"ops"}
        assert (await client.get("/admin/audit?team=search")).status_code == 200

    _run(tmp_path, test)


def test_a_new_secret_shows_once_and_no_page_or_log_holds_a_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, admin = gateway.keys.create("ops", admin=True)
        await sign_in(client, admin)
        made = await client.post("/admin/keys", data={"name": "bob", "team": "search",
                                                      "csrf": await csrf_of(client)})  # fmt: skip
        secret = re.search(r'<code id="secret">([^<]+)</code>', made.text)
        assert secret is not None and made.headers["cache-control"] == "no-store"
        assert gateway.keys.authenticate(secret.group(1)).team == "search"
        seen = [made.text.replace(secret.group(1), "")]
        for path in (*PAGES, "/admin/api/usage"):
            seen.append((await client.get(path)).text)
        for text in [*seen, caplog.text]:
            assert secret.group(1) not in text and admin not in text
            assert not re.search(r"ih-[A-Za-z0-9_\-]{20,}", text)

    _run(tmp_path, test)


def test_the_usage_api_answers_an_admin_key_in_json_and_csv(tmp_path: Path) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        _, admin = gateway.keys.create("ops", admin=True)
        auth = {"authorization": f"Bearer {admin}"}
        as_json = await client.get("/admin/api/usage?by=team&since=7d", headers=auth)
        assert as_json.status_code == 200 and as_json.json()["by"] == "team"
        as_csv = await client.get("/admin/api/usage?format=csv", headers=auth)
        assert as_csv.text.startswith("group,requests,errors")
        bad = await client.get("/admin/api/usage?by=colour", headers=auth)
        assert bad.status_code == 400 and "person" in bad.json()["error"]["message"]
        huge = await client.get("/admin/api/usage?since=99999999d", headers=auth)
        assert huge.status_code == 400

    _run(tmp_path, test)
