"""The API's dependencies, typed once and reused by every route."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.changes import ChangeFeed
from api.problems import Problem
from api.service import JobService
from projections.keys import authenticate
from projections.store import JobStore, Scope


@dataclass
class Services:
    store: JobStore
    jobs: JobService
    feed: ChangeFeed
    max_prompt_bytes: int
    sse_poll_interval_s: float
    sse_keepalive_s: float


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]

bearer = HTTPBearer(auto_error=False, description="An API key from `promptjobs keys create`")


async def get_caller(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Scope:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise Problem(
            401,
            "unauthenticated",
            "Missing API key",
            "send `Authorization: Bearer <key>`; create a key with `promptjobs keys create`",
            headers=challenge,
        )
    scope = await authenticate(services.store.sessions, credentials.credentials)
    if scope is None:
        raise Problem(
            401,
            "invalid_api_key",
            "Invalid API key",
            "the API key is unknown or revoked",
            headers=challenge,
        )
    return scope


Caller = Annotated[Scope, Depends(get_caller)]


async def require_json(request: Request) -> None:
    """A body that is not declared JSON is a 415, not a confusing field error. An empty body
    without a type falls through to validation, which says the body is empty."""
    declared = request.headers.get("content-type")
    if declared is None and not await request.body():
        return
    media = (declared or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise Problem(
            415,
            "unsupported_media_type",
            "Unsupported media type",
            f"the body is {media or 'untyped'}; send JSON with `Content-Type: application/json`",
        )


JsonBody = Depends(require_json)  # after Caller, so a stranger gets 401 first
