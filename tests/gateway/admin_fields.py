"""Every filter and form under the gateway's `/admin` (the console's and its usage API),
and hostile values for each field: what the text-field tests send, to a SQLite gateway and
to one on PostgreSQL."""

from __future__ import annotations

from dataclasses import dataclass

# GET pages and the API, with the query fields each reads
FILTERS = {
    "/admin/usage": ("by", "since", "person", "team"),
    "/admin/usage.svg": ("since", "person", "team"),
    "/admin/cost": ("since",),
    "/admin/audit": ("key", "team", "model", "status", "from", "to"),
    "/admin/api/usage": ("by", "since", "person", "team", "format"),
}
# POST forms, with the fields each reads (all of them also take `csrf`)
_LIMITS = ("rpm", "tpm", "max_concurrent", "quota_tokens", "period", "team", "priority")
FORMS = {
    "/admin/keys": ("name", *_LIMITS, "admin", "log_content", "no_degrade"),
    "/admin/keys/limits": ("name", *_LIMITS),
    "/admin/keys/revoke": ("name",),
    "/admin/keys/rotate": ("name",),
    "/admin/teams": ("name", "quota_tokens", "budget", "period", "hard_stop"),
    "/admin/login": ("key",),
    "/admin/logout": (),
}
# Percent-encoded as a client sends them: NUL alone and inside text, a control character,
# bytes that are not UTF-8, and a UTF-16 surrogate encoded as if it were a character.
HOSTILE = ("%00", "ops%00x", "%01", "%FF", "%C3%28", "%ED%A0%80")


@dataclass(frozen=True)
class Attempt:
    method: str
    path: str  # with its query string
    body: bytes  # a urlencoded form, for POST

    def __str__(self) -> str:
        return f"{self.method} {self.path} {self.body!r}"


def attempts(csrf: str) -> list[Attempt]:
    """One request per field, filter or form, and hostile value; forms carry a valid CSRF
    token (and the other fields they need), so that without the check the value would
    reach the handler and the database."""
    out = [
        Attempt("GET", f"{path}?{field}={value}", b"")
        for path, fields in FILTERS.items()
        for field in fields
        for value in HOSTILE
    ]
    for path, fields in FORMS.items():
        for field in ("csrf", *fields):
            for value in HOSTILE:
                form = {"csrf": csrf, "name": "ops", "key": "ih-x", field: value}
                body = "&".join(f"{k}={v}" for k, v in form.items())
                out.append(Attempt("POST", path, body.encode()))
    return out
