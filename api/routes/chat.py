"""/v1/chat/completions and /v1/models: OpenAI's Chat Completions over promptjobs jobs
(api/openai/chat.py). Each call is a durable job: a client that goes away leaves it running,
and its answer is in /v1/jobs like any other's."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from api.deps import ApiContext, Caller, ContextDep, JsonBody, KeyedCaller
from api.openai.chat import ChatRequest, chat_completion
from api.openai.chat_stream import DONE, ChatChunks
from api.openai.errors import openai_error
from api.openai.responses import ERROR_CODES
from api.problems import problem_responses
from api.routes.events import stream_place
from api.routes.responses import log_stream, wait_settled
from projections.domain.lifecycle import ErrorKind, JobState
from projections.errors import NotFound
from projections.models import Job, Prompt, Response
from projections.rows import JobRow
from projections.scope import Scope

router = APIRouter(prefix="/v1", tags=["openai"])

OPENAI_JSON = {
    "description": "An OpenAI object (see docs/openai.md), or with `stream`, its chunks",
    "content": {
        "application/json": {"schema": {"type": "object"}},
        "text/event-stream": {"schema": {"type": "string"}},
    },
}
# The HTTP status a failed job's blocking call answers with, by its error kind (else 500).
FAILED_STATUS = {
    ErrorKind.PROVIDER_4XX: 400,
    ErrorKind.RATE_LIMIT: 429,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.STUCK: 504,
}


@router.post(
    "/chat/completions",
    response_model=None,
    responses={200: OPENAI_JSON, **problem_responses(400, 401, 413, 415, 429)},
)
async def create_chat_completion(
    body: ChatRequest,
    keyed: KeyedCaller,
    _json: Annotated[None, JsonBody],
    ctx: ContextDep,
    request: Request,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
) -> JSONResponse | EventSourceResponse:
    """OpenAI's `chat.completions.create`: the conversation becomes a job. Answers once it
    has settled, or with `stream`, its chunks as they come."""
    caller = keyed.scope
    submission = body.submission(ctx.jobs.adapters, idempotency_key=idempotency_key)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        with stream_place(ctx, keyed.key_id) as hold:
            accepted = await ctx.jobs.submit(caller, submission)
            prompt = accepted.prompt

            async def answer(row: JobRow) -> tuple[Job, Response]:
                return await _answer(ctx, caller, row.job_id)

            chunks = ChatChunks(prompt, answer, include_usage=include_usage)
            return await log_stream(ctx, keyed, prompt, chunks, _frames, hold)
    accepted = await ctx.jobs.submit(caller, submission)
    prompt, job = await wait_settled(
        ctx, caller, accepted.prompt.prompt_id, request=request, key_id=keyed.key_id
    )
    return await _completion(ctx, caller, prompt, job)


@router.get(
    "/chat/completions/{completion_id}",
    response_model=None,
    responses={200: OPENAI_JSON, **problem_responses(401, 404)},
)
async def retrieve_chat_completion(
    completion_id: str, caller: Caller, ctx: ContextDep
) -> JSONResponse:
    """OpenAI's `chat.completions.retrieve`: the completion a call made, once its job has
    succeeded (a job still running answers 409 `not_ready`; a failed one its error)."""
    try:
        job = await ctx.store.job(caller, "job_" + completion_id.removeprefix("chatcmpl-"))
    except NotFound:
        raise NotFound("chat completion", completion_id) from None
    prompt, _ = await ctx.store.prompt(caller, job.prompt_id)
    if not job.state.is_terminal:
        return openai_error(
            409, f"chat completion {completion_id} is still {job.state.value}", code="not_ready"
        )
    return await _completion(ctx, caller, prompt, job)


@router.get("/models", response_model=None, responses={200: OPENAI_JSON})
async def list_models(_caller: Caller, ctx: ContextDep) -> JSONResponse:
    """OpenAI's `models.list`: each provider this deployment can run, as `provider/model`
    for its default model (any model of a provider is named so: `anthropic/claude-…`), then
    each route the operator named, with its `places`."""
    return JSONResponse({"object": "list", "data": _models(ctx)})


@router.get("/models/{model:path}", response_model=None, responses={200: OPENAI_JSON})
async def retrieve_model(model: str, _caller: Caller, ctx: ContextDep) -> JSONResponse:
    """OpenAI's `models.retrieve`: a model of this deployment's list (`provider/model`)."""
    found = next((m for m in _models(ctx) if m["id"] == model), None)
    if found is None:
        raise NotFound("model", model)
    return JSONResponse(found)


def _models(ctx: ApiContext) -> list[dict[str, Any]]:
    adapters = ctx.jobs.adapters
    providers = [
        {
            "id": f"{name}/{adapters.model_of_provider(name)}",
            "object": "model",
            "created": 0,
            "owned_by": name,
        }
        for name in adapters.names()
    ]
    routes = [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "promptjobs",
            # Where a job naming the route runs, in order (promptjobs' own field).
            "places": [str(place) for place in places],
        }
        for name, places in sorted(adapters.routes.items())
    ]
    return providers + routes


async def _answer(ctx: ApiContext, caller: Scope, job_id: str) -> tuple[Job, Response]:
    job = await ctx.store.job(caller, job_id)
    assert job.response_id is not None
    return job, await ctx.store.response(caller, job.response_id)


async def _completion(ctx: ApiContext, caller: Scope, prompt: Prompt, job: Job) -> JSONResponse:
    """A settled job as its call answers: the completion, or the job's error (never retried
    by the SDK: the job already ran its attempts)."""
    if job.state == JobState.SUCCEEDED and job.response_id is not None:
        answer = await ctx.store.response(caller, job.response_id)
        return JSONResponse(chat_completion(prompt, job, answer))
    if job.state == JobState.CANCELLED:
        status, code, why = 409, "cancelled", "the job was cancelled"
    elif job.state == JobState.FAILED:
        kind = job.error_kind or ErrorKind.UNKNOWN
        status = FAILED_STATUS.get(kind, 500)
        code = ERROR_CODES.get(kind.value, "server_error")
        why = f"{kind.value}: {job.error_message or 'the job failed'}"
    else:
        # The client went away while it waited: nobody reads this answer.
        status, code, why = 409, "not_ready", f"the job is still {job.state.value}"
    message = f"{why} (job {job.job_id})"
    return openai_error(status, message, code=code, headers={"x-should-retry": "false"})


def _frames(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"data: [DONE]\n\n" if chunk is DONE else f"data: {json.dumps(chunk)}\n\n".encode()
        for chunk in chunks
    )
