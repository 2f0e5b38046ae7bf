"""GET /v1/events: the caller's job transitions as Server-Sent Events, resumable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from api.deps import ServicesDep, StreamCaller
from api.problems import problem_responses
from api.routes.jobs import CURSOR_PATTERN
from api.schemas import JobOut

router = APIRouter(prefix="/v1/events", tags=["events"])

BATCH = 200
# Tells a browser's EventSource how soon to reconnect after a drop.
RECONNECT_MS = 1000


@router.get(
    "",
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "A stream of `event: job.state_changed`, `id:` the event cursor, "
            "`data:` the job row (the JobOut schema) as it was after that transition; "
            "`: ping` comments keep idle connections open",
        },
        **problem_responses(401, 404, 422),
    },
    response_class=EventSourceResponse,
)
async def stream_events(
    request: Request,
    caller: StreamCaller,
    services: ServicesDep,
    since: Annotated[
        str | None,
        Query(
            pattern=CURSOR_PATTERN,
            description="Start after this cursor (0: the whole log); default: from now",
        ),
    ] = None,
    job_id: Annotated[str | None, Query(description="Only this job's transitions")] = None,
    prompt_id: Annotated[str | None, Query(description="Only this prompt's jobs")] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            pattern=CURSOR_PATTERN,
            description="Sent on reconnect: resume right after this event (wins over `since`)",
        ),
    ] = None,
) -> EventSourceResponse:
    """Your jobs' transitions, in commit order, live. Reconnect with `Last-Event-ID` (or
    `since`) set to the last `id:` you received and the stream resumes with the next event:
    no gap, no repeat. Each event's data is the row `GET /v1/jobs` returns for that change.
    Authenticate with `Authorization: Bearer <key>`, or, from a browser `EventSource` (which
    cannot send headers), with `?access_token=<key>`."""
    if job_id is not None:
        await services.store.job(caller, job_id)
    if prompt_id is not None:
        await services.store.prompt(caller, prompt_id)
    resume = last_event_id if last_event_id is not None else since
    cursor = int(resume) if resume is not None else await services.store.latest_event_id()

    async def events() -> AsyncIterator[ServerSentEvent]:
        nonlocal cursor
        feed = services.feed
        async with feed.watching(services.store.latest_event_id, services.sse_poll_interval_s):
            yield ServerSentEvent(comment="connected", retry=RECONNECT_MS)
            while True:
                changed = feed.current()
                # A client leaving cancels this generator; a read cut off inside its
                # transaction could leave SQLite's lock held, so the read finishes regardless.
                batch = await asyncio.shield(
                    services.store.events_since(
                        caller, cursor, BATCH, job_id=job_id, prompt_id=prompt_id
                    )
                )
                for event in batch:
                    cursor = event.id
                    row = JobOut.model_validate(event.data).model_dump_json()
                    yield ServerSentEvent(data=row, event=event.type, id=str(event.id))
                if len(batch) == BATCH:
                    continue
                # The API is shutting down (feed closed) or the client left: end the stream.
                if feed.closed or await request.is_disconnected():
                    return
                try:
                    # The feed wakes us on a commit; the timeout is only a safety net.
                    await asyncio.wait_for(changed.wait(), services.sse_keepalive_s)
                except TimeoutError:
                    pass

    return EventSourceResponse(events(), ping=services.sse_keepalive_s)
