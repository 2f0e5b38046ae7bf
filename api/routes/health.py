"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from api.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "A dependency is unreachable"}})
async def readyz(services: ServicesDep) -> JSONResponse:
    """The database and Temporal are reachable."""
    checks: dict[str, str] = {}
    try:
        async with services.store.sessions() as session:
            await session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as err:
        checks["database"] = f"unreachable: {type(err).__name__}"
    try:
        await services.jobs.dispatcher.client.service_client.check_health()
        checks["temporal"] = "ok"
    except Exception as err:
        checks["temporal"] = f"unreachable: {type(err).__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks},
        status_code=200 if ready else 503,
    )
