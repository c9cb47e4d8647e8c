"""Checked values of the gateway's TOML: each bad value a ConfigError naming its key."""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from inhouse.gateway.priority import CLASSES

DEFAULT_QUEUE_WAIT_S = 30.0
DEFAULT_INTERACTIVE_SEATS = 1  # seats of each replica kept for interactive work (`seats`)
DEFAULT_BATCH_FREE_REPLICAS = 1  # replicas kept free of batch while others ask (`seats`)
# A replica holding a request's prefix takes it while it carries at most this many requests
# more than the least-loaded one (`affinity`): a cached prefix saves a whole prefill, a
# request or four queued ahead of it cost less.
DEFAULT_PREFIX_SLACK = 4
# An idle client connection stays open this long. Longer than the idle time of every common
# client pool (httpx and the openai SDKs 5 s, aiohttp 15 s, a load balancer's 60 s), so the
# client closes first: a server that closes at the same moment races the client's next request
# onto a dying connection, which fails before any answer (and a client retries no POST).
KEEP_ALIVE_S = 75.0
MAX_WAIT_S = 86_400.0  # a day: longer waits are a mistake, and asyncio timers need finite ones


class ConfigError(ValueError):
    """The gateway configuration is invalid; the message says which key and why."""


def reject_unknown(table: dict[str, Any], where: str, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)}")


def queue_waits(value: Any, where: str) -> tuple[float, tuple[tuple[str, float], ...]]:
    """`queue_max_wait_s`: seconds for every class, or a table of seconds per class
    (`{interactive = 5, batch = 120}`; classes it does not name wait its `default`, else
    `DEFAULT_QUEUE_WAIT_S`). The default class's wait and the per-class ones."""
    what = f"{where}.queue_max_wait_s"
    if not isinstance(value, dict):
        return seconds(value, what), ()
    unknown = sorted(set(value) - set(CLASSES))
    if unknown:
        raise ConfigError(f"{what}: unknown class(es) {unknown}; classes are {list(CLASSES)}")
    waits = {name: seconds(v, f"{what}.{name}") for name, v in value.items()}
    return waits.get("default", DEFAULT_QUEUE_WAIT_S), tuple(sorted(waits.items()))


def seconds(value: Any, what: str) -> float:
    """A number of seconds from 0 to `MAX_WAIT_S`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}")
    if not 0 <= value <= MAX_WAIT_S:  # NaN fails this too
        raise ConfigError(f"{what} must be from 0 to {MAX_WAIT_S:g} seconds, got {value!r}")
    return float(value)


def env_secret(table: dict[str, Any], key: str, where: str) -> str | None:
    """The value of the environment variable `table[key]` names (None when `key` is absent);
    a named variable that is unset is a ConfigError."""
    if key not in table:
        return None
    value = os.environ.get(str(table[key]))
    if not value:
        raise ConfigError(f"{where}.{key}: ${table[key]} is not set (or is empty)")
    return value


def networks(value: Any, what: str) -> tuple[str, ...]:
    """IP addresses or CIDR networks, each checked (no "*": trusting every client's
    X-Forwarded-For is what the list exists to prevent)."""
    if not isinstance(value, list):
        raise ConfigError(f"{what} must be a list of IP addresses or networks")
    for item in value:
        try:
            ipaddress.ip_network(str(item), strict=False)
        except ValueError:
            raise ConfigError(f"{what}: not an IP address or network: {item!r}") from None
    return tuple(str(item) for item in value)


def optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def non_negative_int(value: Any, what: str) -> int:
    """An integer ≥ 0 (0: none)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def name_list(value: Any, where: str) -> frozenset[str]:
    """A list of distinct, non-empty names (a backend's `adapters`)."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where} must be a list of names, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where} names one twice: {value!r}")
    return frozenset(value)


def owned_once(owners: dict[str, frozenset[str]], taken: list[str], what: str) -> None:
    """Each name of `owners`' sets belongs to one owner and is none of `taken`: a request
    naming it must find one place to go."""
    seen: dict[str, str] = {}
    for owner, names in owners.items():
        for name in sorted(names):
            if name in taken:
                raise ConfigError(f"{what} {name!r} of model {owner!r} is also a model's name")
            if seen.setdefault(name, owner) != owner:
                raise ConfigError(f"{what} {name!r} is declared for {seen[name]!r} and {owner!r}")
