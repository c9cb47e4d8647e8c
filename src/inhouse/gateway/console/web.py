"""The console's plumbing: templates, security headers, the session check, CSRF on forms."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from inhouse.gateway.console.forms import FormError, parse_form
from inhouse.gateway.console.session import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_S,
    Session,
    Sessions,
)

HERE = Path(__file__).parent
HEADERS = {
    "cache-control": "no-store",  # a page may show a secret once: never keep it
    "content-security-policy": "default-src 'none'; style-src 'self'; img-src 'self';"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
Handler = Callable[[Request, Session, dict[str, str]], Awaitable[Response]]


class Web:
    """Renders pages and guards every one of them."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self._templates = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"])
        )

    def page(
        self, template: str, session: Session | None, status: int = 200, **context: Any
    ) -> HTMLResponse:
        csrf = None if session is None else self.sessions.csrf(session.cookie)
        who = None if session is None else session.key.name
        html = self._templates.get_template(template).render(csrf=csrf, who=who, **context)
        return HTMLResponse(html, status, headers=HEADERS)

    def refuse(self, session: Session | None, status: int, message: str) -> HTMLResponse:
        return self.page("message.html", session, status, title=str(status), message=message)

    def session(self, request: Request) -> Session | None:
        return self.sessions.check(request.cookies.get(SESSION_COOKIE))

    def to_login(self) -> Response:
        return RedirectResponse("/admin/login", 303, headers=HEADERS)

    async def form(self, request: Request, handler: Handler) -> Response:
        """A POST from a signed-in admin with a valid CSRF token and no foreign Origin."""
        session = self.session(request)
        if session is None:
            return self.to_login()
        try:
            form = parse_form(await request.body())
        except FormError as err:
            return self.refuse(session, 400, str(err))
        if not same_origin(request) or not self.sessions.csrf_ok(session.cookie, form.get("csrf")):
            return self.refuse(session, 403, "This form is stale or came from another site.")
        try:
            return await handler(request, session, form)
        except (FormError, ValueError, LookupError) as err:
            return self.refuse(session, 400, str(err))

    def login_form(self, request: Request, status: int = 200, error: str = "") -> Response:
        nonce = secrets.token_urlsafe(16)
        response = self.page(
            "login.html", None, status, login_csrf=self.sessions.csrf("login:" + nonce),
            error=error,
        )  # fmt: skip
        set_cookie(response, request, LOGIN_COOKIE, nonce, 600)
        return response

    def signed_in(self, request: Request, cookie: str) -> Response:
        response = RedirectResponse("/admin", 303, headers=HEADERS)
        set_cookie(response, request, SESSION_COOKIE, cookie, SESSION_S)
        response.delete_cookie(LOGIN_COOKIE, path="/admin", httponly=True, samesite="strict")
        return response


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    """HttpOnly, SameSite=Strict, Secure when the request came over TLS, under /admin."""
    response.set_cookie(
        name, value, max_age=max_age, path="/admin", httponly=True, samesite="strict",
        secure=request.url.scheme == "https",
    )  # fmt: skip


def same_origin(request: Request) -> bool:
    """False when the browser says the form came from another origin."""
    origin = request.headers.get("origin")
    if origin is None:  # not a browser, or one that sends none: the CSRF token decides
        return True
    return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"
