"""POST /v1/prompts (submit), GET /v1/prompts (the caller's, newest first) and
GET /v1/prompts/{id} (a prompt and its jobs)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status

from api.deps import Caller, ContextDep, JsonBody
from api.problems import problem_responses
from api.schemas import Accepted, PromptList, PromptOut, SubmitPrompt
from projections.models import Prompt
from projections.writes import Submission
from services.webhooks import check_webhook_url

router = APIRouter(prefix="/v1/prompts", tags=["prompts"])

ACCEPTED_HEADERS = {
    "Location": {"description": "The job's URL", "schema": {"type": "string"}, "required": True},
    "Idempotent-Replayed": {
        "description": "`true` when an Idempotency-Key replay returned the original job",
        "schema": {"type": "string", "enum": ["true"]},
    },
}


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=Accepted,
    responses={
        202: {"headers": ACCEPTED_HEADERS},
        **problem_responses(401, 404, 413, 415, 422),
    },
    summary="Submit a prompt; answers at once with the queued job",
)
async def submit_prompt(
    body: SubmitPrompt,
    caller: Caller,
    _json: Annotated[None, JsonBody],
    ctx: ContextDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            description="Repeat a submission safely: the same key and body from the same user "
            "return the original job (202, `Idempotent-Replayed: true`); the same key with a "
            "different body is a 422",
        ),
    ] = None,
) -> Accepted:
    submission = Submission(
        text=body.prompt or "",
        messages=body.messages_as_sent(),
        priority=body.priority,
        max_attempts=body.max_attempts,
        options=body.options_as_sent(),
        scheduled_for=body.scheduled_for,
        idempotency_key=idempotency_key,
        parent_id=body.parent_id,
        correlation_id=body.correlation_id,
        after=tuple(body.after),
        webhook=body.webhook,
        webhook_events=None if body.webhook_events is None else list(body.webhook_events),
    )
    if body.webhook is not None:
        await check_webhook_url(body.webhook, ctx.webhooks_allowed, field="webhook")
    accepted = await ctx.jobs.submit(caller, submission)
    response.headers["Location"] = f"/v1/jobs/{accepted.job.job_id}"
    if not accepted.created:
        response.headers["Idempotent-Replayed"] = "true"
    return Accepted(
        prompt_id=accepted.prompt.prompt_id, job_id=accepted.job.job_id, state=accepted.job.state
    )


# A page of prompts carries at most about this much prompt text and options (one prompt
# always: a single prompt is bounded by max_prompt_bytes).
PROMPT_PAGE_CHARS = 1 << 20


@router.get("", response_model=PromptList, responses=problem_responses(401, 404, 422))
async def list_prompts(
    caller: Caller,
    ctx: ContextDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    before: Annotated[
        str | None, Query(max_length=40, description="A `next_before`: the page after it")
    ] = None,
) -> PromptList:
    """The caller's prompts, newest submitted first, each with its newest 10 jobs (oldest
    first; the last is the current one) and `job_count`. `cursor` lets a client follow
    changes from this read on. A page ends early (with `next_before`) once its prompts'
    texts and options pass 1 MiB: prompts of 100 kB each come a few at a time."""
    # Read the cursor first: any change committed after it is also after the page below.
    cursor = await ctx.store.latest_event_id()
    # One more than asked tells whether an older page exists.
    page = await ctx.store.prompts_before(caller, limit + 1, before)
    kept = _fitting([prompt for prompt, *_ in page[:limit]])
    more = len(page) > kept
    page = page[:kept]
    children = await ctx.store.children(caller, [prompt.prompt_id for prompt, *_ in page])
    return PromptList(
        prompts=[PromptOut.of(p, jobs, children[p.prompt_id], n) for p, jobs, n in page],
        next_before=page[-1][0].prompt_id if more else None,
        cursor=str(cursor),
    )


def _fitting(prompts: list[Prompt]) -> int:
    """How many of `prompts`, from the first, one page carries (at least one)."""
    weight = 0
    for taken, prompt in enumerate(prompts):
        weight += len(prompt.text) + len(json.dumps(prompt.options))
        weight += len(json.dumps(prompt.messages)) if prompt.messages else 0
        if weight > PROMPT_PAGE_CHARS and taken > 0:
            return taken
    return len(prompts)


@router.get("/{prompt_id}", response_model=PromptOut, responses=problem_responses(401, 404))
async def read_prompt(prompt_id: str, caller: Caller, ctx: ContextDep) -> PromptOut:
    """The prompt and every job it has had (retries included), oldest first, with its chain:
    the prompts it runs after and those that run after it."""
    prompt, jobs = await ctx.store.prompt(caller, prompt_id)
    children = await ctx.store.children(caller, [prompt_id])
    return PromptOut.of(prompt, jobs, children[prompt_id])
