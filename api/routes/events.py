"""GET /v1/events: the caller's job transitions as Server-Sent Events, resumable."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from api.changes import StreamHold, StreamScope, frame
from api.deps import ApiContext, ContextDep, StreamCaller
from api.problems import problem_responses
from api.routes.jobs import CURSOR_PATTERN
from projections.domain.lifecycle import EventType

router = APIRouter(prefix="/v1/events", tags=["events"])

BATCH = 200
# Tells a browser's EventSource how soon to reconnect after a drop.
RECONNECT_MS = 1000
LIFETIME_JITTER = 0.1
SEND_TIMEOUT_S = 60.0
# How often an idle stream of one job asks whether the job is over without a job.done.
OVER_CHECK_S = 5.0


@contextmanager
def stream_place(ctx: ApiContext, key_id: str) -> Iterator[StreamHold]:
    """A stream's place, held while the request makes what it will stream (StreamLimit, a
    429, before anything is made), and given back if the block leaves without subscribing."""
    hold = ctx.feed.hold(key_id)
    try:
        yield hold
    finally:
        ctx.feed.release(hold)


@router.get(
    "",
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "A stream of `event: job.state_changed`, `id:` the event cursor, "
            "`data:` the job row (the JobOut schema) as it was after that transition; "
            "`: ping` comments keep idle connections open",
        },
        **problem_responses(401, 404, 422, 429),
    },
    response_class=EventSourceResponse,
)
async def stream_events(
    caller: StreamCaller,
    ctx: ContextDep,
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
    cannot send headers), with `?access_token=<key>`.

    A stream of one job (`?job_id=`) ends once it has sent the job's `job.done` event (the
    job has settled and its last text and usage are in): do not reconnect then. A job
    settled more than 30 s ago without one (its worker died while it was being cancelled)
    ends the same way after its last event.

    Any stream ends cleanly after `PROMPTJOBS_SSE_MAX_LIFETIME_S`, when its client reads too
    slowly, when its key is revoked, or when the API shuts down: reconnect with
    `Last-Event-ID` and nothing is missed. Too many open streams (per key, per API process)
    is a `429` with `Retry-After`."""
    scope = caller.scope
    store = ctx.store
    # Where this job's stream ends (its job.done), once known; None: not yet, or not a job's.
    over: int | None = None
    if job_id is not None:
        over = await store.job_over_at(scope, job_id)
    if prompt_id is not None:
        await ctx.store.prompt(scope, prompt_id)
    resume = last_event_id if last_event_id is not None else since
    feed = ctx.feed
    # Past the bound on streams, StreamLimit: a 429 with Retry-After (api/problems.py).
    sub = await ctx.feed.subscribe(StreamScope.of(scope, job_id, prompt_id), caller.key_id)
    # Streams opened together (after a deploy, say) should not all end together.
    lifetime_s = ctx.sse_max_lifetime_s * (1 - LIFETIME_JITTER * random.random())

    def job_over(events: list[Any], cursor: int) -> bool:
        """Whether a job's stream has sent all of it: its job.done, or up to `over`."""
        if job_id is None:
            return False
        return any(e.type == EventType.DONE for e in events) or (
            over is not None and cursor >= over
        )

    async def events() -> AsyncIterator[ServerSentEvent | bytes]:
        nonlocal over
        # Delivered up to here; the live feed starts after `sub.start`, and whatever came
        # before that (the resume's backlog) is read from the log, so the seam has no gap,
        # and dropping what is not after `cursor` leaves no duplicate.
        cursor = int(resume) if resume is not None else sub.start
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lifetime_s
        next_over_check = loop.time() + OVER_CHECK_S
        try:
            yield ServerSentEvent(comment="connected", retry=RECONNECT_MS)
            if job_over([], cursor):
                return  # a resume after the job's end: nothing more will come
            while cursor < sub.start and sub.ended is None:
                # A client leaving cancels this generator; a read cut off inside its
                # transaction could leave SQLite's lock held, so the read finishes regardless.
                backlog = await asyncio.shield(
                    store.events_since(
                        scope, cursor, BATCH, job_id=job_id, prompt_id=prompt_id, until=sub.start
                    )
                )
                if not backlog:
                    break
                yield b"".join(frame(event) for event in backlog)
                cursor = backlog[-1].id
                if job_over(backlog, cursor):
                    return
            while sub.ended is None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return  # the lifetime is over: the client resumes with Last-Event-ID
                wait = remaining if job_id is None else min(remaining, OVER_CHECK_S)
                live = [event for event in await sub.take(wait) if event.id > cursor]
                if live:
                    # Everything queued goes out in one write: many small events of one job
                    # cost one send, not one each.
                    yield b"".join(event.frame for event in live)
                    cursor = live[-1].id
                    if job_over(live, cursor):
                        return
                elif job_id is not None and loop.time() >= next_over_check:
                    # A job settled without a job.done (its worker died): it ends by time.
                    next_over_check = loop.time() + OVER_CHECK_S
                    over = await asyncio.shield(store.job_over_at(scope, job_id))
                    if job_over([], cursor):
                        return
        finally:
            feed.unsubscribe(sub)

    return EventSourceResponse(
        events(),
        ping=ctx.sse_keepalive_s,
        # A client that stops reading altogether: its connection is dropped, not kept.
        send_timeout=SEND_TIMEOUT_S,
        # If the stream never starts (the client left at once), its slot is freed anyway.
        background=BackgroundTask(feed.unsubscribe, sub),
    )
