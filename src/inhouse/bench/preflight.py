"""Checks made before a run starts: the server answers, the key works, the model is served."""

from __future__ import annotations

import httpx

from inhouse.api.errors import error_message


class EndpointError(Exception):
    """The endpoint cannot be benchmarked; the message says why, in one line."""


async def check_endpoint(http: httpx.AsyncClient, model: str) -> list[str]:
    """The model ids the server lists; raises `EndpointError` unless `model` is among them."""
    url = str(http.base_url).rstrip("/")
    try:
        response = await http.get("/v1/models")
    except httpx.TimeoutException as exc:
        raise EndpointError(f"{url} did not answer GET /v1/models in time") from exc
    except httpx.TransportError as exc:
        raise EndpointError(f"cannot reach {url}: {exc or type(exc).__name__}") from exc
    if response.status_code in (401, 403):
        raise EndpointError(
            f"{url} rejected the API key (HTTP {response.status_code}: "
            f"{error_message(response.content)}); pass a valid one with --api-key"
        )
    if response.status_code != 200:
        raise EndpointError(
            f"{url} answered GET /v1/models with HTTP {response.status_code}: "
            f"{error_message(response.content)}"
        )
    try:
        models = [str(item["id"]) for item in response.json()["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise EndpointError(f"{url}/v1/models is not an OpenAI model list") from exc
    if model not in models:
        served = ", ".join(models) or "nothing"
        raise EndpointError(f"model {model!r} is not served at {url}; it serves: {served}")
    return models
