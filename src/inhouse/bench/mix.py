"""`inhouse bench run --mix`: what each traffic class of a mixed run sends, parsed from one
option value per class.

    --mix 'interactive: max-concurrency=1, input-len=40, output-len=64, num-prompts=20,
           priority=-1, api-key-env=INTERACTIVE_KEY'
    --mix 'batch: max-concurrency=16, input-len=1000, output-len=256, priority=1'

A class with ``num-prompts`` (or ``duration``) is *counted*; one with neither runs in the
*background*: it keeps its requests in flight until every counted class is done, which is how
a batch job sits under interactive traffic. Keys never appear on the command line: a class
names the environment variable holding its key (``api-key-env``), else the run's ``--api-key``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inhouse.bench.settings import SettingsError

MAX_CLASSES = 8
MAX_CONCURRENCY = 4096
MAX_TOKENS = 1_000_000
MAX_PROMPTS = 1_000_000
MAX_SECONDS = 86_400.0
PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # vLLM's `priority` is a C int
MAX_SALT_CHARS = 1024
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_KEYS = (
    "max-concurrency",
    "input-len",
    "output-len",
    "num-prompts",
    "duration",
    "delay",
    "priority",
    "api-key-env",
    "cache-salt",
)


@dataclass(slots=True, frozen=True)
class MixClass:
    """One class of a mixed run: its closed-loop shape, lengths, and what tags its requests.

    ``priority`` goes out as vLLM's per-request ``priority`` field and ``cache_salt`` as
    vLLM's ``cache_salt`` (the tenant an `inhouse serve` without a gateway sees); None sends
    neither. ``delay`` seconds pass before the class's first request.
    """

    name: str
    max_concurrency: int = 1
    input_len: int = 256
    output_len: int = 128
    num_prompts: int | None = None
    duration: float | None = None
    delay: float = 0.0
    priority: int | None = None
    api_key_env: str | None = None
    cache_salt: str | None = None

    @property
    def background(self) -> bool:
        """True when the class runs until the counted classes are done."""
        return self.num_prompts is None and self.duration is None

    def extra_body(self) -> dict[str, Any]:
        """The body fields this class adds to every request it sends."""
        body: dict[str, Any] = {}
        if self.priority is not None:
            body["priority"] = self.priority
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        return body

    def api_key(self, default: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
        """The key from ``api_key_env`` (which must be set), else the run's key."""
        if self.api_key_env is None:
            return default
        key = environ.get(self.api_key_env)
        if not key:
            raise SettingsError(
                f"--mix {self.name}: api-key-env={self.api_key_env} is not set or empty"
            )
        return key

    def to_json(self) -> dict[str, Any]:
        """The class as the results file records it (the variable's name, never its value)."""
        return {
            "name": self.name,
            "max_concurrency": self.max_concurrency,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "num_prompts": self.num_prompts,
            "duration": self.duration,
            "delay": self.delay,
            "background": self.background,
            "priority": self.priority,
            "api_key_env": self.api_key_env,
            "cache_salt_given": self.cache_salt is not None,
        }


def _bounded_int(name: str, key: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"--mix {name}: {key}={text!r} is not an integer") from None
    if not low <= value <= high:
        raise SettingsError(f"--mix {name}: {key} must lie in {low}..{high}, not {value}")
    return value


def _seconds(name: str, key: str, text: str, low: float) -> float:
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise SettingsError(f"--mix {name}: {key}={text!r} is not a number of seconds") from None
    if not low <= value <= MAX_SECONDS:  # also refuses nan
        raise SettingsError(f"--mix {name}: {key} must lie in {low:g}..{MAX_SECONDS:g} s")
    return value


def parse_mix_class(text: str, *, input_len: int, output_len: int) -> MixClass:
    """`NAME: key=value, …` → MixClass; lengths default to the run's ``--input-len`` and
    ``--output-len``. A clear SettingsError names what is wrong."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not _NAME.match(name):
        raise SettingsError(
            f"--mix {text!r}: start with a class name (letters, digits, - or _, at most 32) "
            "and a colon, e.g. 'batch: max-concurrency=16, input-len=1000'"
        )
    fields: dict[str, Any] = {"input_len": input_len, "output_len": output_len}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or key not in _KEYS:
            raise SettingsError(f"--mix {name}: {part!r} is not one of {', '.join(_KEYS)}=…")
        attr = key.replace("-", "_")
        if attr == "max_concurrency":
            fields[attr] = _bounded_int(name, key, value, 1, MAX_CONCURRENCY)
        elif attr in ("input_len", "output_len"):
            fields[attr] = _bounded_int(name, key, value, 1, MAX_TOKENS)
        elif attr == "num_prompts":
            fields[attr] = _bounded_int(name, key, value, 1, MAX_PROMPTS)
        elif attr == "priority":
            fields[attr] = _bounded_int(name, key, value, *PRIORITY_RANGE)
        elif attr == "duration":
            fields[attr] = _seconds(name, key, value, 0.001)
        elif attr == "delay":
            fields[attr] = _seconds(name, key, value, 0.0)
        elif attr == "api_key_env":
            if not _ENV_NAME.match(value):
                raise SettingsError(f"--mix {name}: api-key-env={value!r} is not a variable name")
            fields[attr] = value
        elif not 1 <= len(value) <= MAX_SALT_CHARS:
            raise SettingsError(f"--mix {name}: cache-salt must have 1 to {MAX_SALT_CHARS} chars")
        else:
            fields[attr] = value
    return MixClass(name=name, **fields)


def parse_mix(texts: Sequence[str], *, input_len: int, output_len: int) -> list[MixClass]:
    """Every ``--mix`` value: 2 to `MAX_CLASSES` classes with distinct names, at least one
    of them counted (or the run would never end)."""
    classes = [parse_mix_class(t, input_len=input_len, output_len=output_len) for t in texts]
    if not 2 <= len(classes) <= MAX_CLASSES:
        raise SettingsError(f"--mix takes 2 to {MAX_CLASSES} classes, not {len(classes)}")
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise SettingsError(f"--mix class names must differ: {', '.join(names)}")
    if all(c.background for c in classes):
        raise SettingsError(
            "--mix: give at least one class num-prompts=… or duration=… (a class without "
            "either runs in the background until the counted ones are done)"
        )
    return classes
