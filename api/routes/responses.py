"""/v1/responses: OpenAI's Responses API over promptjobs prompts (api/openai/), and
GET /v1/responses/rsp_…, what a succeeded job produced, in promptjobs' own shape."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse

from activities.adapters.base import parse_options
from activities.adapters.options import PromptOptions
from api.deps import Caller, JsonBody, Services, ServicesDep
from api.openai.responses import CreateResponse, UnsupportedParameter, prompt_id_of, response_object
from api.problems import problem_responses
from api.routes.prompts import check_prompt_size
from api.schemas import ResponseOut
from projections.errors import InvalidState
from projections.scope import Scope
from projections.writes import Submission

router = APIRouter(prefix="/v1/responses", tags=["responses"])

# How long a cancel waits for the job to settle before answering it as it is.
CANCEL_WAIT_S = 5.0
# A wait for a job re-reads it this often at first, then at most every POLL_MAX_S.
POLL_FIRST_S = 0.05
POLL_MAX_S = 0.5

OPENAI_OBJECT = {
    "description": "An OpenAI `response` object (see docs/openai.md)",
    "content": {"application/json": {"schema": {"type": "object"}}},
}


@router.post("", responses={200: OPENAI_OBJECT, **problem_responses(400, 401, 404, 413, 415)})
async def create_response(
    body: CreateResponse,
    caller: Caller,
    _json: Annotated[None, JsonBody],
    services: ServicesDep,
    request: Request,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
) -> JSONResponse:
    """OpenAI's `responses.create`: one prompt and its job. With `background`, answers at
    once (`queued`); without, once the job has settled (the job runs durably either way: a
    client that leaves does not cancel it)."""
    body.check_supported()
    if body.stream:
        raise UnsupportedParameter("stream", "streaming is not supported yet")
    text, system = body.prompt_and_system()
    check_prompt_size(services, text, system, "instructions and system messages")
    options = body.options(services.jobs.adapters, system)
    parse_options(PromptOptions, options, "promptjobs.options")
    services.jobs.validate_options(options)
    await services.jobs.check_budget(text, options)
    submission = Submission(
        text=text,
        priority=body.promptjobs.priority,
        max_attempts=body.promptjobs.max_attempts or services.jobs.max_attempts_default,
        options=options,
        idempotency_key=idempotency_key,
        openai=body.kept(),
    )
    accepted = await services.jobs.submit(caller, submission)
    prompt_id = accepted.prompt.prompt_id
    if body.background:
        return JSONResponse(await _object(services, caller, prompt_id))
    return JSONResponse(await _settled(services, caller, prompt_id, request=request))


@router.get(
    "/{response_id}",
    response_model=None,
    responses={200: {"model": ResponseOut, **OPENAI_OBJECT}, **problem_responses(401, 404)},
)
async def read_response(
    response_id: str, caller: Caller, services: ServicesDep
) -> ResponseOut | JSONResponse:
    """`resp_…`: OpenAI's `responses.retrieve`. `rsp_…`: a succeeded job's answer as
    promptjobs keeps it (the ResponseOut schema)."""
    if response_id.startswith("rsp_"):
        return ResponseOut.of(await services.store.response(caller, response_id))
    return JSONResponse(await _object(services, caller, prompt_id_of(response_id)))


@router.post("/{response_id}/cancel", responses={200: OPENAI_OBJECT, **problem_responses(401, 404)})
async def cancel_response(response_id: str, caller: Caller, services: ServicesDep) -> JSONResponse:
    """OpenAI's `responses.cancel`: cancels the job and answers the response once it has
    settled (or after 5 s, still `in_progress`). A settled response is answered as it is."""
    prompt_id = prompt_id_of(response_id)
    _, jobs = await services.store.prompt(caller, prompt_id)
    if not jobs[-1].state.is_terminal:
        try:
            await services.jobs.cancel(caller, jobs[-1].job_id)
        except InvalidState:
            pass  # it settled meanwhile
    return JSONResponse(await _settled(services, caller, prompt_id, timeout_s=CANCEL_WAIT_S))


async def _object(services: Services, caller: Scope, prompt_id: str) -> dict[str, Any]:
    """The response object of the prompt as it is now."""
    prompt, jobs = await services.store.prompt(caller, prompt_id)
    job = jobs[-1]
    if job.response_id is None:
        return response_object(prompt, job)
    answer = await services.store.response(caller, job.response_id)
    return response_object(
        prompt, job, text=answer.text, finish_reason=answer.finish_reason, model=answer.model
    )


async def _settled(
    services: Services,
    caller: Scope,
    prompt_id: str,
    *,
    timeout_s: float | None = None,
    request: Request | None = None,
) -> dict[str, Any]:
    """The response object once its job has settled, or as it is when `timeout_s` is over or
    the client has gone."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    pause = POLL_FIRST_S
    while True:
        _, jobs = await services.store.prompt(caller, prompt_id)
        over = jobs[-1].state.is_terminal
        if over or (deadline is not None and loop.time() >= deadline):
            return await _object(services, caller, prompt_id)
        if request is not None and await request.is_disconnected():
            return await _object(services, caller, prompt_id)
        await asyncio.sleep(pause)
        pause = min(pause * 2, POLL_MAX_S)
