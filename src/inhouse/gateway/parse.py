"""Step 2 of a request: its JSON body read into the model route and what it needs, or a 4xx
when the model is unknown to the key or no upstream of it could ever serve the request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inhouse.api.errors import invalid_request, not_found
from inhouse.gateway.config import GatewayConfig, ModelRoute
from inhouse.gateway.keys import ApiKey
from inhouse.gateway.needs import BadRequest, Needs, read_needs
from inhouse.gateway.priority import DEFAULT_CLASS, BadPriority, effective_class
from inhouse.gateway.routing import Router


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request the gateway understood and some upstream of its model can serve."""

    endpoint: str
    body: dict[str, Any]
    route: ModelRoute
    needs: Needs
    priority: str = DEFAULT_CLASS  # its effective class (see `priority.effective_class`)


def model_name(body: dict[str, Any]) -> str | None:
    """The body's `model` when it is a string."""
    model = body.get("model")
    return model if isinstance(model, str) else None


def parse(
    config: GatewayConfig, router: Router, key: ApiKey, endpoint: str, body: dict[str, Any],
    model: str | None,
) -> Parsed:  # fmt: skip
    """The route and needs of `body` (asking for `model`, see `model_name`) on `endpoint`;
    APIError (400 or 404) when refused."""
    route = _route(config, key, model)
    try:
        needs = read_needs(endpoint, body)
    except BadRequest as err:
        raise invalid_request(str(err), err.param) from None
    gap = router.capability_gap(route, needs, key.allow_fallback)
    if gap is not None:
        raise invalid_request(f"{gap} (model {route.name!r})", code="unsupported_capability")
    try:
        priority = effective_class(key.priority, body)
    except BadPriority as err:
        raise invalid_request(str(err), "priority") from None
    return Parsed(endpoint, body, route, needs, priority)


def _route(config: GatewayConfig, key: ApiKey, model: str | None) -> ModelRoute:
    if model is None:
        raise invalid_request("'model' is required", "model")
    route = config.model(model)
    if route is None or not key.may_use(model):
        raise not_found(
            f"The model '{model}' does not exist or you do not have access to it.",
            "model",
            "model_not_found",
        )
    return route
