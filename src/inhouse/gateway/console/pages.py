"""The console's pages under /admin: sign-in, overview, keys, teams, usage, cost, audit and
health. GET pages read; every change is a POST form with a CSRF token (see `web`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from inhouse.cost.compare import compare, report_lines
from inhouse.gateway.audit.search import AuditQuery, search
from inhouse.gateway.console import forms
from inhouse.gateway.console.chart import bar_chart
from inhouse.gateway.console.session import LOGIN_COOKIE, SESSION_COOKIE, Session
from inhouse.gateway.console.web import HEADERS, Web, same_origin
from inhouse.gateway.handler import Gateway
from inhouse.gateway.keys import AuthError
from inhouse.gateway.priority import CLASSES
from inhouse.gateway.usage.report import GROUPINGS, usage
from inhouse.gateway.usage.traffic import measured

WARN_AT = 0.8  # a team's share of its budget shown as a warning (as the Prometheus alert)


def console_pages(gateway: Gateway, web: Web) -> APIRouter:
    """The router of every console page."""
    router = APIRouter(prefix="/admin", include_in_schema=False)  # HTML, not the OpenAI API
    keys, teams, db, cost = gateway.keys, gateway.teams, gateway.db, gateway.config.cost

    @router.get("/login")
    async def login_page(request: Request) -> Response:
        if web.session(request) is not None:
            return web.signed_in(request, request.cookies[SESSION_COOKIE])
        return web.login_form(request)

    @router.post("/login")
    async def login(request: Request) -> Response:
        client = request.client.host if request.client else "?"
        allowed, wait = web.sessions.may_try_login(client)
        if not allowed:
            response = web.refuse(None, 429, "Too many sign-in attempts; wait a minute.")
            response.headers["retry-after"] = str(max(1, round(wait)))
            return response
        form = forms.parse_form(await request.body())
        nonce = request.cookies.get(LOGIN_COOKIE)
        token_ok = web.sessions.csrf_ok(None if nonce is None else "login:" + nonce,
                                        form.get("csrf"))  # fmt: skip
        if not token_ok or not same_origin(request):
            return web.login_form(request, 403, "The sign-in form was stale; try again.")
        try:
            key = await asyncio.to_thread(keys.authenticate, form.get("key", "").strip())
        except AuthError:
            return web.login_form(request, 401, "That key is not valid.")
        if not key.admin:
            return web.refuse(None, 403, "This key is not an admin key.")
        return web.signed_in(request, web.sessions.issue(key))

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        async def out(_r: Request, session: Session, _f: dict[str, str]) -> Response:
            await asyncio.to_thread(web.sessions.end, session.cookie)
            response = web.to_login()
            response.delete_cookie(SESSION_COOKIE, path="/admin", httponly=True, samesite="strict")
            return response

        return await web.form(request, out)

    def guarded(render: Any) -> Any:
        """A GET page for signed-in admins, run in a worker thread (it queries the database)."""

        async def page(request: Request) -> Response:
            session = await asyncio.to_thread(web.session, request)
            if session is None:
                return web.to_login()
            try:
                return await asyncio.to_thread(render, request, session)
            except forms.FormError as err:
                return web.refuse(session, 400, str(err))

        return page

    def overview(request: Request, session: Session) -> Response:
        now = time.time()
        status, health = gateway.router.health()
        return web.page("overview.html", session, teams=_team_rows(teams.list(), now),
                        health=health, healthy=status == 200)  # fmt: skip

    def keys_page(request: Request, session: Session, created: tuple[str, str] | None = None,
                  status: int = 200) -> Response:  # fmt: skip
        now = time.time()
        rows = [
            {"key": k, "state": k.state_at(now), "quota": k.quota_used_at(now)} for k in keys.list()
        ]
        return web.page("keys.html", session, status, keys=rows, created=created)

    async def create_key(request: Request, session: Session, form: dict[str, str]) -> Response:
        name, team = forms.name(form, "name"), forms.optional_name(form, "team")
        quota = forms.limit(form, "quota_tokens")
        limits = {
            "rpm": forms.limit(form, "rpm"), "tpm": forms.limit(form, "tpm"),
            "max_concurrent": forms.limit(form, "max_concurrent"), "quota_tokens": quota,
            "quota_period_s": forms.duration(form, "period", "30d") if quota else None,
            "team": team, "admin": forms.checked(form, "admin"),
            "log_content": forms.checked(form, "log_content"),
            "priority": forms.choice(form, "priority", CLASSES),
            "allow_degrade": not forms.checked(form, "no_degrade"),
        }  # fmt: skip
        if team is not None:
            await asyncio.to_thread(teams.ensure, team)
        _, secret = await asyncio.to_thread(lambda: keys.create(name, **limits))
        return await asyncio.to_thread(keys_page, request, session, (name, secret), 201)

    async def change_key(request: Request, session: Session, form: dict[str, str]) -> Response:
        name = forms.name(form, "name")
        changes: dict[str, Any] = {
            field: forms.limit(form, field)
            for field in ("rpm", "tpm", "max_concurrent", "quota_tokens")
        }
        changes["team"] = forms.optional_name(form, "team")
        priority = forms.choice(form, "priority", CLASSES)
        if priority is not None:
            changes["priority"] = priority
        if changes["quota_tokens"]:
            changes["quota_period_s"] = forms.duration(form, "period", "30d")
        if changes["team"] is not None:
            await asyncio.to_thread(teams.ensure, changes["team"])
        await asyncio.to_thread(lambda: keys.update(name, **changes))
        return _back("/admin/keys")

    async def revoke_key(request: Request, session: Session, form: dict[str, str]) -> Response:
        await asyncio.to_thread(keys.revoke, forms.name(form, "name"))
        return _back("/admin/keys")

    async def rotate_key(request: Request, session: Session, form: dict[str, str]) -> Response:
        """A new secret for a key, shown once; the old one and the key's sessions end."""
        key, secret = await asyncio.to_thread(keys.rotate, forms.name(form, "name"))
        return await asyncio.to_thread(keys_page, request, session, (key.name, secret), 201)

    def teams_page(request: Request, session: Session) -> Response:
        rows = _team_rows(teams.list(), time.time())
        return web.page("teams.html", session, teams=rows, currency=cost.currency)

    async def save_team(request: Request, session: Session, form: dict[str, str]) -> Response:
        name = forms.name(form, "name")
        limits = {
            "quota_tokens": forms.limit(form, "quota_tokens"),
            "budget": forms.amount(form, "budget"),
            "hard_stop": forms.checked(form, "hard_stop"),
            "period_s": forms.duration(form, "period", "30d"),
        }
        if await asyncio.to_thread(teams.find, name) is None:
            period = limits.pop("period_s")
            await asyncio.to_thread(lambda: teams.create(name, period, **limits))
        else:
            await asyncio.to_thread(lambda: teams.update(name, **limits))
        return _back("/admin/teams")

    def usage_page(request: Request, session: Session) -> Response:
        q = request.query_params
        by = q.get("by", "person") if q.get("by") in GROUPINGS else "person"
        since = forms.duration(dict(q), "since", "30d")
        only = _only(q)
        rows = usage(db, by, time.time() - since, prices=cost.charged, only=only)
        chart = "/admin/usage.svg?" + str(request.query_params)
        return web.page("usage.html", session, rows=rows, by=by, groupings=GROUPINGS,
                        since=q.get("since", "30d"), only=only, chart=chart,
                        currency=cost.currency)  # fmt: skip

    def usage_chart(request: Request, session: Session) -> Response:
        q = request.query_params
        since = forms.duration(dict(q), "since", "30d")
        only = _only(q)
        now = time.time()
        found = {r.group: r for r in usage(db, "day", now - since, only=only)}
        points = []
        for day in range(int((now - since) // 86400), int(now // 86400) + 1):  # empty days too
            label = dt.datetime.fromtimestamp(day * 86400, dt.UTC).strftime("%Y-%m-%d")
            row = found.get(label)
            points.append((label, row.prompt_tokens if row else 0,
                           row.completion_tokens if row else 0))  # fmt: skip
        who = ", ".join(f"{k} {v}" for k, v in only.items()) or "everyone"
        svg = bar_chart(points, f"Tokens per day (UTC), {who}, last {q.get('since', '30d')}")
        return Response(svg, media_type="image/svg+xml", headers=HEADERS)

    def cost_page(request: Request, session: Session) -> Response:
        since_text = request.query_params.get("since", "30d")
        since = forms.duration({"since": since_text}, "since", "30d")
        now = time.time()
        result = compare(measured(db, now - since, now, cost.retry_window_s), cost)
        return web.page("cost.html", session, lines=report_lines(result, cost.currency,
                        since_text), since=since_text)  # fmt: skip

    def audit_page(request: Request, session: Session) -> Response:
        q = request.query_params
        status = q.get("status", "").strip()
        if status and not (status.isdigit() and len(status) == 3):
            raise forms.FormError("status: a three-digit HTTP status is expected")
        query = AuditQuery(
            key_name=q.get("key") or None, team=q.get("team") or None,
            model=q.get("model") or None, status=int(status) if status else None,
            since=_instant(q.get("from")), until=_instant(q.get("to")),
        )  # fmt: skip
        rows = search(db, query)
        return web.page("audit.html", session, rows=rows, q=q, when=_when)

    def health_page(request: Request, session: Session) -> Response:
        status, health = gateway.router.health()
        states = {m: gateway.releases.store.state(m) for m in health["models"]}
        return web.page("health.html", session, health=health, healthy=status == 200,
                        releases=states, set_aside=gateway.audit.set_aside)  # fmt: skip

    for path, render in (("", overview), ("/keys", keys_page), ("/teams", teams_page),
                         ("/usage", usage_page), ("/usage.svg", usage_chart),
                         ("/cost", cost_page), ("/audit", audit_page),
                         ("/health", health_page)):  # fmt: skip
        router.add_api_route(path, guarded(render), methods=["GET"])
    for path, change in (("/keys", create_key), ("/keys/limits", change_key),
                         ("/keys/revoke", revoke_key), ("/keys/rotate", rotate_key),
                         ("/teams", save_team)):  # fmt: skip
        router.add_api_route(path, _posted(web, change), methods=["POST"])
    return router


def _posted(web: Web, change: Any) -> Any:
    async def post(request: Request) -> Response:
        return await web.form(request, change)

    return post


def _back(path: str) -> Response:
    return RedirectResponse(path, 303, headers=HEADERS)


def _only(q: Any) -> dict[str, str]:
    return {f: q[f].strip() for f in ("person", "team") if q.get(f, "").strip()}


def _team_rows(found: list[Any], now: float) -> list[dict[str, Any]]:
    rows = []
    for team in found:
        ratios = team.ratios(now)
        worst = max(ratios.values(), default=0.0)
        level = "spent" if worst >= 1 else "warning" if worst >= WARN_AT else "ok"
        tokens, money = team.used_at(now)
        rows.append({"team": team, "tokens": tokens, "money": money, "ratios": ratios,
                     "level": level})  # fmt: skip
    return rows


def _instant(text: str | None) -> float | None:
    """A datetime-local field (UTC) as a timestamp."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        raise forms.FormError(f"not a date and time: {text!r}") from None


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
