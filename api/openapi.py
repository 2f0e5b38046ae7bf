"""The OpenAPI document: FastAPI's, made exact where FastAPI's defaults would mislead."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.problems import PROBLEM_JSON

PROBLEM_REF = {"$ref": "#/components/schemas/ProblemDetails"}
PROBLEM_SCHEMAS = {PROBLEM_REF["$ref"], "#/components/schemas/HTTPValidationError"}


def exact_openapi(
    app: FastAPI, providers: Iterable[str], routes: Iterable[str] = ()
) -> dict[str, Any]:
    """Every error is `application/problem+json` with the ProblemDetails schema (FastAPI would
    say application/json, and HTTPValidationError for 422), `options.provider` (and each
    fallback's) lists the providers this deployment runs and `options.route` the routes its
    operator named, so a document-valid request is one the server accepts."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    for operations in document["paths"].values():
        for operation in operations.values():
            for response in operation.get("responses", {}).values():
                refs = {
                    c.get("schema", {}).get("$ref") for c in response.get("content", {}).values()
                }
                if refs & PROBLEM_SCHEMAS:
                    response["content"] = {PROBLEM_JSON: {"schema": PROBLEM_REF}}
    schemas = document["components"]["schemas"]
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["PromptOptions"]["properties"]["provider"]["anyOf"] = [
        {"type": "string", "enum": sorted(providers)},
        {"type": "null"},
    ]
    fallback = schemas["Fallback"]["properties"]["provider"]
    for bound in ("minLength", "maxLength", "pattern"):
        fallback.pop(bound, None)
    fallback["enum"] = sorted(providers)
    # The routes the operator named (none: the field takes only null).
    named = sorted(routes)
    schemas["PromptOptions"]["properties"]["route"]["anyOf"] = [
        *([{"type": "string", "enum": named}] if named else []),
        {"type": "null"},
    ]
    app.openapi_schema = document
    return document
