"""Prometheus metrics: this process's counters, and queue depth read from the projection."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import ContextDep
from api.problems import Problem

router = APIRouter(tags=["health"])


def token_matches(expected: str | None, presented: str | None) -> bool:
    """No token configured: open. Otherwise the bearer must match (in constant time)."""
    if expected is None:
        return True
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def bearer_token(authorization: str | None) -> str | None:
    scheme, _, credentials = (authorization or "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


async def require_metrics_token(
    ctx: ContextDep,
    # Not the API-key security scheme: open by default, so the document declares no auth.
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    if not token_matches(ctx.metrics_token, bearer_token(authorization)):
        raise Problem(
            401,
            "unauthenticated",
            "Metrics token required",
            "send `Authorization: Bearer <PROMPTJOBS_METRICS_TOKEN>`",
            headers={"WWW-Authenticate": "Bearer"},
        )


@router.get("/metrics", response_class=Response, dependencies=[Depends(require_metrics_token)])
async def scrape(ctx: ContextDep) -> Response:
    """Prometheus text format: counts, never content. Open unless `PROMPTJOBS_METRICS_TOKEN`
    is set; then it takes `Authorization: Bearer <token>` (not an API key)."""
    await ctx.queue_depth.refresh()
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
