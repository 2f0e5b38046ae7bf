"""/v1/responses: OpenAI's Responses API over promptjobs prompts (api/openai/), and
GET /v1/responses/rsp_…, what a succeeded job produced, in promptjobs' own shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from api.changes import StreamHold, StreamLimit, StreamScope, Subscription
from api.deps import ApiContext, Caller, ContextDep, JsonBody, KeyedCaller, Streamer
from api.openai.responses import (
    CreateResponse,
    JobLike,
    UnsupportedParameter,
    answered_object,
    continued,
    prompt_id_of,
    response_object,
    status_of,
    submission_of,
)
from api.openai.stream import ResponseEvents
from api.problems import problem_responses
from api.routes.events import (
    BATCH,
    LIFETIME_JITTER,
    OVER_CHECK_S,
    SEND_TIMEOUT_S,
    stream_place,
)
from api.schemas import ResponseOut
from projections.domain.lifecycle import EventType, JobState
from projections.errors import InvalidState, NotFound
from projections.models import Job, JobEvent, Prompt
from projections.rows import JobRow
from projections.scope import Scope

router = APIRouter(prefix="/v1/responses", tags=["responses"])

# How long a cancel waits for the job to settle before answering it as it is.
CANCEL_WAIT_S = 5.0
# A wait for a job re-reads it this often at first, then at most every POLL_MAX_S.
POLL_FIRST_S = 0.05
POLL_MAX_S = 0.5

OPENAI_OBJECT = {
    "description": "An OpenAI `response` object (see docs/openai.md), or with `stream`, its "
    "events (`text/event-stream`)",
    "content": {
        "application/json": {"schema": {"type": "object"}},
        "text/event-stream": {"schema": {"type": "string"}},
    },
}


@router.post(
    "",
    response_model=None,
    responses={200: OPENAI_OBJECT, **problem_responses(400, 401, 404, 413, 415, 429)},
)
async def create_response(
    body: CreateResponse,
    keyed: KeyedCaller,
    _json: Annotated[None, JsonBody],
    ctx: ContextDep,
    request: Request,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
) -> JSONResponse | EventSourceResponse:
    """OpenAI's `responses.create`: one prompt and its job. With `stream`, answers its events
    as they happen; with `background`, answers at once (`queued`); else once the job has
    settled. The job runs durably either way: a client that leaves does not cancel it."""
    caller = keyed.scope
    before = None
    if body.previous_response_id is not None:
        before = await _previous(ctx, caller, body.previous_response_id)
    submission = submission_of(
        body, ctx.jobs.adapters, idempotency_key=idempotency_key, before=before
    )
    if body.stream:
        # The stream's place first: refused at the limit, nothing is made (the SDK retries a
        # 429 without an Idempotency-Key, and each retry would make another job).
        with stream_place(ctx, keyed.key_id) as hold:
            accepted = await ctx.jobs.submit(caller, submission)
            return await _stream(ctx, keyed, accepted.prompt, starting_after=None, hold=hold)
    accepted = await ctx.jobs.submit(caller, submission)
    prompt_id = accepted.prompt.prompt_id
    if body.background:
        return JSONResponse(await _object(ctx, caller, prompt_id))
    return JSONResponse(
        await _settled(ctx, caller, prompt_id, request=request, key_id=keyed.key_id)
    )


async def _previous(ctx: ApiContext, caller: Scope, response_id: str) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` names: its request and its answer, which
    must be there (the response completed)."""
    with named_as_response(response_id):
        prompt, jobs = await ctx.store.prompt(caller, prompt_id_of(response_id))
    job = jobs[-1]
    if job.state != JobState.SUCCEEDED or job.response_id is None:
        raise UnsupportedParameter(
            "previous_response_id",
            f"response {response_id} is {status_of(job, None)}: continue from a completed one",
            code="invalid_value",
        )
    return continued(prompt, await ctx.store.response(caller, job.response_id))


@router.get(
    "/{response_id}",
    response_model=None,
    responses={200: {"model": ResponseOut, **OPENAI_OBJECT}, **problem_responses(401, 404)},
)
async def read_response(
    response_id: str,
    keyed: KeyedCaller,
    ctx: ContextDep,
    stream: Annotated[bool, Query(description="Answer the response's events (OpenAI's)")] = False,
    starting_after: Annotated[
        int | None, Query(ge=-1, description="With `stream`: the events after this sequence number")
    ] = None,
) -> ResponseOut | JSONResponse | EventSourceResponse:
    """`resp_…`: OpenAI's `responses.retrieve`, with `stream=true` its events from the
    start (or after `starting_after`), replayed from the log and then live. `rsp_…`: a
    succeeded job's answer as promptjobs keeps it (the ResponseOut schema)."""
    caller = keyed.scope
    if response_id.startswith("rsp_"):
        return ResponseOut.of(await ctx.store.response(caller, response_id))
    with named_as_response(response_id):
        if stream:
            prompt, _ = await ctx.store.prompt(caller, prompt_id_of(response_id))
            return await _stream(ctx, keyed, prompt, starting_after=starting_after)
        return JSONResponse(await _object(ctx, caller, prompt_id_of(response_id)))


@router.post("/{response_id}/cancel", responses={200: OPENAI_OBJECT, **problem_responses(401, 404)})
async def cancel_response(response_id: str, caller: Caller, ctx: ContextDep) -> JSONResponse:
    """OpenAI's `responses.cancel`: cancels the job and answers the response once it has
    settled (or after 5 s, still `in_progress`). A settled response is answered as it is."""
    prompt_id = prompt_id_of(response_id)
    with named_as_response(response_id):
        _, jobs = await ctx.store.prompt(caller, prompt_id)
    if not jobs[-1].state.is_terminal:
        try:
            await ctx.jobs.cancel(caller, jobs[-1].job_id)
        except InvalidState:
            pass  # it settled meanwhile
    return JSONResponse(await _settled(ctx, caller, prompt_id, timeout_s=CANCEL_WAIT_S))


@contextlib.contextmanager
def named_as_response(response_id: str) -> Iterator[None]:
    """A response that is not found is answered by the id the caller sent, not by the
    prompt id it maps to (`resp_x` is prompt `pmt_x`), which the caller never saw."""
    try:
        yield
    except NotFound as err:
        if err.what != "prompt":
            raise
        raise NotFound("response", response_id) from None


async def _object(ctx: ApiContext, caller: Scope, prompt_id: str) -> dict[str, Any]:
    """The response object of the prompt as it is now."""
    prompt, jobs = await ctx.store.prompt(caller, prompt_id)
    return await _object_of(ctx, caller, prompt, jobs[-1])


async def _object_of(
    ctx: ApiContext, caller: Scope, prompt: Prompt, job: JobLike
) -> dict[str, Any]:
    """The response object of `prompt` whose current job is `job` (with its answer, if any)."""
    if job.response_id is None:
        return response_object(prompt, job)
    return answered_object(prompt, job, await ctx.store.response(caller, job.response_id))


async def _settled(
    ctx: ApiContext,
    caller: Scope,
    prompt_id: str,
    *,
    timeout_s: float | None = None,
    request: Request | None = None,
    key_id: str | None = None,
) -> dict[str, Any]:
    """The response object once its job has settled (`wait_settled`)."""
    prompt, job = await wait_settled(
        ctx, caller, prompt_id, timeout_s=timeout_s, request=request, key_id=key_id
    )
    return await _object_of(ctx, caller, prompt, job)


async def wait_settled(
    ctx: ApiContext,
    caller: Scope,
    prompt_id: str,
    *,
    timeout_s: float | None = None,
    request: Request | None = None,
    key_id: str | None = None,
) -> tuple[Prompt, Job]:
    """The prompt and its current job once that has settled, or as they are when
    `timeout_s` is over or the client has gone. With `key_id` the wait follows the live
    feed, reading the prompt again only when one of its jobs changed state (at least every
    OVER_CHECK_S); without it, or with the key's streams all taken, it polls."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    pause = POLL_FIRST_S
    sub: Subscription | None = None
    if key_id is not None:
        with contextlib.suppress(StreamLimit):
            sub = await ctx.feed.subscribe(StreamScope.of(caller, None, prompt_id), key_id)
    try:
        while True:
            prompt, jobs = await ctx.store.prompt(caller, prompt_id)
            if (
                jobs[-1].state.is_terminal
                or (deadline is not None and loop.time() >= deadline)
                or (request is not None and await request.is_disconnected())
            ):
                return prompt, jobs[-1]
            wait = OVER_CHECK_S if deadline is None else max(0.0, deadline - loop.time())
            if sub is not None and sub.ended is None:
                until = loop.time() + min(wait, OVER_CHECK_S)
                # Output events only say the text grew: wait on for a change of state.
                while (left := until - loop.time()) > 0 and sub.ended is None:
                    live = await sub.take(left)
                    if any(event.type == EventType.STATE_CHANGED for event in live):
                        break
            else:
                await asyncio.sleep(min(pause, wait))
                pause = min(pause * 2, POLL_MAX_S)
    finally:
        if sub is not None:
            ctx.feed.unsubscribe(sub)


async def _stream(
    ctx: ApiContext,
    keyed: Streamer,
    prompt: Prompt,
    *,
    starting_after: int | None,
    hold: StreamHold | None = None,
) -> EventSourceResponse:
    """The response's events from the prompt's event log, then live (api/openai/stream.py):
    every API process gives the same events with the same sequence numbers."""
    scope = keyed.scope

    async def snapshot(row: JobRow, final: bool) -> dict[str, Any]:
        if not final:
            return response_object(prompt, row)
        return await _object_of(ctx, scope, prompt, row)

    def frames(events: list[dict[str, Any]]) -> bytes:
        return b"".join(
            ServerSentEvent(data=json.dumps(event), event=event["type"]).encode()
            for event in events
            if starting_after is None or event["sequence_number"] > starting_after
        )

    return await log_stream(ctx, keyed, prompt, ResponseEvents(prompt, snapshot), frames, hold)


class LogTranslator(Protocol):
    """What a stream made from a prompt's event log answers for each event (in log order),
    and at the end of a job that settled without its job.done."""

    over: bool

    async def feed(self, event: JobEvent) -> list[dict[str, Any]]: ...

    async def finish(self, row: JobRow) -> list[dict[str, Any]]: ...


async def log_stream(
    ctx: ApiContext,
    keyed: Streamer,
    prompt: Prompt,
    translator: LogTranslator,
    frames: Callable[[list[dict[str, Any]]], bytes],
    hold: StreamHold | None = None,
) -> EventSourceResponse:
    """A prompt's event log, then live, each event as `translator` says, encoded by
    `frames`: the log is read again whenever the feed says the prompt has a new event."""
    scope, store, prompt_id = keyed.scope, ctx.store, prompt.prompt_id
    sub = await ctx.feed.subscribe(StreamScope.of(scope, None, prompt_id), keyed.key_id, hold)
    lifetime_s = ctx.sse_max_lifetime_s * (1 - LIFETIME_JITTER * random.random())

    async def events() -> AsyncIterator[bytes]:
        cursor, until = 0, sub.start
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lifetime_s
        try:
            while True:
                # Everything up to `until` is final in the log: read it (in batches).
                while rows := await asyncio.shield(
                    store.events_since(scope, cursor, BATCH, prompt_id=prompt_id, until=until)
                ):
                    out = [frame for row in rows for frame in await translator.feed(row)]
                    cursor = rows[-1].id
                    if data := frames(out):
                        yield data
                    if translator.over:
                        return
                remaining = deadline - loop.time()
                if sub.ended is not None or remaining <= 0:
                    return  # the client resumes with `starting_after`
                live = await sub.take(min(remaining, OVER_CHECK_S))
                if live:
                    until = max(until, *(event.id for event in live))
                    continue
                # Idle: a job that settled without a job.done (its worker died) ends by time.
                _, jobs = await asyncio.shield(store.prompt(scope, prompt_id))
                over = await asyncio.shield(store.job_over_at(scope, jobs[-1].job_id))
                if over is not None and cursor >= over:
                    if data := frames(await translator.finish(JobRow.model_validate(jobs[-1]))):
                        yield data
                    return
        finally:
            ctx.feed.unsubscribe(sub)

    return EventSourceResponse(
        events(),
        ping=ctx.sse_keepalive_s,
        send_timeout=SEND_TIMEOUT_S,
        background=BackgroundTask(ctx.feed.unsubscribe, sub),
    )
