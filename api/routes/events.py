"""GET /v1/events: the caller's job transitions as Server-Sent Events, resumable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from api.deps import ServicesDep, StreamCaller
from api.problems import Problem
from api.routes.prompts import PROBLEMS

router = APIRouter(prefix="/v1/events", tags=["events"])

BATCH = 200


@router.get(
    "",
    responses={
        **PROBLEMS,
        200: {
            "content": {"text/event-stream": {}},
            "description": "`event: job.state_changed`, `id:` the cursor, data: the job row",
        },
    },
    response_class=EventSourceResponse,
)
async def stream_events(
    request: Request,
    caller: StreamCaller,
    services: ServicesDep,
    since: Annotated[
        str | None,
        Query(pattern=r"^\d{1,18}$", description="Start after this cursor; default: from now"),
    ] = None,
    job_id: str | None = None,
    prompt_id: str | None = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """A reconnect with `Last-Event-ID` resumes right after that event: no gap, no repeat.
    Authenticate with `Authorization: Bearer <key>`, or, from a browser `EventSource` (which
    cannot send headers), with `?access_token=<key>`."""
    resume = last_event_id if last_event_id is not None else since
    if resume is not None and not resume.isdigit():
        raise Problem(422, "validation", "Invalid cursor", "Last-Event-ID must be an event id")
    cursor = int(resume) if resume is not None else await services.store.latest_event_id()

    async def events() -> AsyncIterator[ServerSentEvent]:
        nonlocal cursor
        while True:
            changed = services.feed.current()
            batch = await services.store.events_since(
                caller, cursor, BATCH, job_id=job_id, prompt_id=prompt_id
            )
            for event in batch:
                cursor = event.id
                yield ServerSentEvent(data=_json(event.data), event=event.type, id=str(event.id))
            if len(batch) == BATCH:
                continue
            if services.feed.closed or await request.is_disconnected():
                return
            try:
                await asyncio.wait_for(changed.wait(), services.sse_poll_interval_s)
            except TimeoutError:
                pass

    return EventSourceResponse(events(), ping=int(max(1, services.sse_keepalive_s)))


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))
