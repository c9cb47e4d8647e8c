"""``--lora-modules`` as vLLM spells it: ``name=path``, or JSON ``{"name": ..., "path": ...}``
(``base_model_name`` is accepted and must be the served base, which it always is here)."""

from __future__ import annotations

import json
import re

from inhouse.engine.errors import EngineConfigError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


def parse_lora_modules(values: list[str]) -> dict[str, str]:
    """Adapter paths by name; EngineConfigError for a malformed or repeated entry."""
    modules: dict[str, str] = {}
    for value in values:
        name, path = _one(value.strip())
        if not NAME.match(name):
            raise EngineConfigError(
                f"--lora-modules: {name!r} is not a usable adapter name (letters, digits and "
                "._:/@+- , at most 128)"
            )
        if name in modules:
            raise EngineConfigError(f"--lora-modules: {name!r} is given twice")
        modules[name] = path
    return modules


def _one(value: str) -> tuple[str, str]:
    if value.startswith("{"):
        try:
            entry = json.loads(value)
            return str(entry["name"]), str(entry["path"])
        except (ValueError, KeyError, TypeError):
            raise EngineConfigError(
                f'--lora-modules: {value!r} is not {{"name": ..., "path": ...}}'
            ) from None
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise EngineConfigError(f"--lora-modules: {value!r} is not name=path")
    return name, path
