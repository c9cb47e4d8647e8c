"""Where an adapter runs: the base model whose replicas (or fallback) serve it, and those
replicas. What a replica serves is its config's `adapters`, then what it lists itself
(`sync`), changed at once by loads and unloads through the gateway (`Backend.adapters`)."""

from __future__ import annotations

from inhouse.gateway.backends import Backend
from inhouse.gateway.config import ModelRoute
from inhouse.gateway.routing import Router


def base_of(router: Router, adapter: str) -> ModelRoute | None:
    """The model whose replicas or fallback serve `adapter`, if any does."""
    for name, backends in router.backends.items():
        route = router.routes[name]
        if any(adapter in b.adapters for b in backends) or fallback_serves(route, adapter):
            return route
    return None


def serving(router: Router, route: ModelRoute, adapter: str) -> list[Backend]:
    """The replicas of `route` that serve `adapter` now."""
    return [b for b in router.backends[route.name] if adapter in b.adapters]


def fallback_serves(route: ModelRoute, adapter: str | None) -> bool:
    """Whether the model's fallback may take a request for `adapter` (None: the base)."""
    return adapter is None or (route.fallback is not None and adapter in route.fallback.adapters)


def served(router: Router) -> dict[str, str]:
    """Every adapter served now, with its base model's name."""
    out: dict[str, str] = {}
    for name, backends in router.backends.items():
        fallback = router.routes[name].fallback
        for adapter in (*(a for b in backends for a in b.adapters),
                        *(() if fallback is None else fallback.adapters)):  # fmt: skip
            out.setdefault(adapter, name)
    return dict(sorted(out.items()))
