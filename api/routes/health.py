"""Liveness and readiness."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from api.deps import ContextDep
from api.schemas import Health, Readiness

router = APIRouter(tags=["health"])

# A dependency that hangs is as unready as one that refuses; answer within a probe's timeout.
CHECK_TIMEOUT_S = 2.0


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "A dependency is unreachable"}},
)
async def readyz(ctx: ContextDep) -> JSONResponse:
    """The projection database and Temporal are reachable."""

    async def database() -> None:
        async with ctx.store.sessions() as session:
            await session.execute(text("SELECT 1"))

    async def temporal() -> None:
        await ctx.jobs.dispatcher.client.service_client.check_health()

    checks: dict[str, str] = {}
    for name, probe in (("database", database), ("temporal", temporal)):
        try:
            await asyncio.wait_for(probe(), CHECK_TIMEOUT_S)
            checks[name] = "ok"
        except Exception as err:  # any failure means not ready; the body says which and why
            checks[name] = f"unreachable: {type(err).__name__}"
    ready = all(value == "ok" for value in checks.values())
    body = Readiness(status="ready" if ready else "not_ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
