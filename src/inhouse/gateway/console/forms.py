"""Reading the console's forms (`application/x-www-form-urlencoded`) into bounded values."""

from __future__ import annotations

from urllib.parse import parse_qsl

from inhouse.gateway.durations import parse_duration

MAX_FORM_BYTES = 64 * 1024
MAX_INT = 10**12  # no limit a person types is larger; keeps SQLite's integers in range
MAX_NAME = 200


class FormError(ValueError):
    """A field that is missing or out of range; the message names it."""


def parse_form(body: bytes) -> dict[str, str]:
    """The fields of a urlencoded body (the last value of a repeated field)."""
    if len(body) > MAX_FORM_BYTES:
        raise FormError("the form is too large")
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except UnicodeDecodeError:
        raise FormError("the form is not UTF-8") from None


def name(form: dict[str, str], field: str) -> str:
    """A required name: 1 to 200 printable characters, no spaces at either end."""
    value = form.get(field, "").strip()
    if not value or len(value) > MAX_NAME or not value.isprintable():
        raise FormError(f"{field}: a name of 1 to {MAX_NAME} printable characters is required")
    return value


def optional_name(form: dict[str, str], field: str) -> str | None:
    return name(form, field) if form.get(field, "").strip() else None


def limit(form: dict[str, str], field: str) -> int | None:
    """An optional whole number >= 0; empty or 0 means no limit (None)."""
    text = form.get(field, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) > MAX_INT:
        raise FormError(f"{field}: a whole number from 0 to {MAX_INT} is expected")
    return int(text) or None


def amount(form: dict[str, str], field: str) -> float | None:
    """An optional amount of money >= 0; empty or 0 means none."""
    text = form.get(field, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise FormError(f"{field}: a number is expected") from None
    if not 0 <= value <= MAX_INT:
        raise FormError(f"{field}: a number from 0 to {MAX_INT} is expected")
    return value or None


def duration(form: dict[str, str], field: str, default: str) -> float:
    """A duration such as 30d or 12h (at most ten years)."""
    text = form.get(field, "").strip() or default
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        raise FormError(f"{field}: {err}") from None
    if not 0 < seconds <= 3650 * 86400:
        raise FormError(f"{field}: between 1 s and 3650 d")
    return seconds


def checked(form: dict[str, str], field: str) -> bool:
    return form.get(field) in ("on", "1", "true")


def choice(form: dict[str, str], field: str, choices: tuple[str, ...]) -> str | None:
    """One of `choices`, or None when the field is absent or empty."""
    text = form.get(field, "").strip()
    if not text:
        return None
    if text not in choices:
        raise FormError(f"{field}: one of {', '.join(choices)} is expected")
    return text
