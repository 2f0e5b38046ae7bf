"""Prometheus metrics: this process's counters, and queue depth read from the projection."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import ServicesDep
from projections import metrics
from projections.operations import jobs_by_state

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response)
async def scrape(services: ServicesDep) -> Response:
    """Prometheus text format. Unauthenticated like /healthz: it carries counts, not content."""
    metrics.record_queue_depth(await jobs_by_state(services.store.sessions))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
