"""``--lora-modules`` as vLLM spells it: ``name=path``, or JSON ``{"name": ..., "path": ...}``
(``base_model_name`` is accepted and must be the served base, which it always is here); the
plan reads the same list (``inhouse.plan.adapters``)."""

from __future__ import annotations

from inhouse.engine.errors import EngineConfigError
from inhouse.plan import adapters
from inhouse.plan.errors import PlanError


def parse_lora_modules(values: list[str]) -> dict[str, str]:
    """Adapter paths by name; EngineConfigError for a malformed or repeated entry."""
    try:
        return adapters.parse_lora_modules(values)
    except PlanError as error:
        raise EngineConfigError(str(error)) from None
