"""The gateway's ``/openapi.json``: FastAPI's routes plus the proxied OpenAI routes, which
`GatewayFront` serves as raw ASGI, each with its request schema (the body `inhouse serve`
takes) so schema-driven clients and fuzzers can drive them."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from inhouse.api.errors import ErrorResponse
from inhouse.gateway.endpoints import ENDPOINTS

REF = "#/components/schemas/{model}"


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (served at ``/openapi.json``) include the proxied routes."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = gateway_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def gateway_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema of ``app`` with a POST operation for every proxied route."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    models = [*(e.schema for e in ENDPOINTS.values()), ErrorResponse]
    keys, defs = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {}).update(defs.get("$defs", {}))
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    error = {"content": {"application/json": {"schema": keys[(ErrorResponse, "validation")]}}}
    for endpoint in ENDPOINTS.values():
        path, model = endpoint.path, endpoint.schema
        body = {"application/json": {"schema": keys[(model, "validation")]}}
        schema.setdefault("paths", {})[path] = {
            endpoint.method.lower(): {
                "summary": f"Proxied to the model's backend: {model.__doc__ or path}",
                "operationId": "proxy_" + path.strip("/").replace("/", "_"),
                "security": [{"bearer": []}],
                "requestBody": {"required": True, "content": body},
                "responses": {
                    "200": {"description": "The backend's answer (JSON, or SSE when streamed)."},
                    "default": {"description": "OpenAI's error body.", **error},
                },
            }
        }
    return schema
