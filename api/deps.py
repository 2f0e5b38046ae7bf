"""The API's dependencies, typed once and reused by every route."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from activities.webhooks import Allowed
from api.changes import ChangeFeed
from api.problems import Problem
from projections.keys import KeyCache, key_id_of
from projections.metrics import QueueDepth
from projections.scope import Scope
from projections.store import JobStore
from services.jobs import JobService
from services.openai_batches import BatchRunner


@dataclass
class ApiContext:
    """What every route is handed (`ContextDep`): the store, the job service, the event feed,
    the `/v1/batches` runner and the limits the API enforces. Built once per app by
    promptjobs/runtime.py."""

    store: JobStore
    jobs: JobService
    feed: ChangeFeed
    batches: BatchRunner
    max_prompt_bytes: int
    max_image_bytes: int
    max_file_bytes: int
    org_max_file_bytes: int
    sse_keepalive_s: float
    sse_max_lifetime_s: float
    queue_depth: QueueDepth
    keys: KeyCache = field(default_factory=KeyCache)
    # Where webhook URLs may point besides public addresses (PROMPTJOBS_WEBHOOK_ALLOW_*).
    webhooks_allowed: Allowed = field(default_factory=Allowed)
    metrics_token: str | None = field(default=None, repr=False)


async def get_context(request: Request) -> ApiContext:
    # async: FastAPI would run a plain `def` dependency in its thread pool, a thread hop
    # per request for one attribute read.
    ctx: ApiContext = request.app.state.context
    return ctx


ContextDep = Annotated[ApiContext, Depends(get_context)]

bearer = HTTPBearer(auto_error=False, description="An API key from `promptjobs keys create`")


# Longer than any key `promptjobs keys create` makes; a token past it is not looked up.
MAX_TOKEN_CHARS = 200


def _well_formed(token: str) -> bool:
    """A key is printable ASCII: anything else (a NUL byte, which PostgreSQL refuses with an
    error) is refused before it reaches the database."""
    return len(token) <= MAX_TOKEN_CHARS and token.isascii() and token.isprintable()


async def _authenticate(
    ctx: ApiContext, token: str | None, request: Request | None = None
) -> Scope:
    challenge = {"WWW-Authenticate": "Bearer"}
    if request is not None and len(request.headers.getlist("authorization")) > 1:
        raise Problem(
            400,
            "ambiguous_credentials",
            "More than one Authorization header",
            "send exactly one `Authorization: Bearer <key>` header",
        )
    if token is None:
        raise Problem(
            401,
            "unauthenticated",
            "Missing API key",
            "send `Authorization: Bearer <key>`; create a key with `promptjobs keys create`",
            headers=challenge,
        )
    scope = await ctx.keys.authenticate(ctx.store.keys, token) if _well_formed(token) else None
    if scope is None:
        raise Problem(
            401,
            "invalid_api_key",
            "Invalid API key",
            "the API key is unknown or revoked",
            headers=challenge,
        )
    return scope


async def get_caller(
    request: Request,
    ctx: ContextDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Scope:
    token = credentials.credentials if credentials else None
    return await _authenticate(ctx, token, request)


@dataclass(frozen=True)
class Streamer:
    """The caller of a stream, and which key it came with: streams are bounded per key, and
    end when their key is revoked."""

    scope: Scope
    key_id: str


async def get_stream_caller(
    request: Request,
    ctx: ContextDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    access_token: Annotated[
        str | None,
        Query(
            description="The API key, for clients that cannot set headers (a browser's "
            "`EventSource`); the `Authorization` header is preferred and wins when both are sent"
        ),
    ] = None,
) -> Streamer:
    """For GET /v1/events only: a key in the URL can end up in logs and history, so no other
    route accepts one."""
    return await _streamer(ctx, credentials.credentials if credentials else access_token, request)


async def get_keyed_caller(
    request: Request,
    ctx: ContextDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Streamer:
    """A caller with its key's id, for routes that may answer with a stream (the key in the
    Authorization header only)."""
    return await _streamer(ctx, credentials.credentials if credentials else None, request)


async def _streamer(ctx: ApiContext, token: str | None, request: Request) -> Streamer:
    scope = await _authenticate(ctx, token, request)
    assert token is not None
    key_id = key_id_of(token)
    assert key_id is not None  # authenticated, so well formed
    return Streamer(scope, key_id)


Caller = Annotated[Scope, Depends(get_caller)]
KeyedCaller = Annotated[Streamer, Depends(get_keyed_caller)]
StreamCaller = Annotated[Streamer, Depends(get_stream_caller)]


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
