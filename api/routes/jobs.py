"""Jobs: read one, list changes after a cursor, cancel, retry."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from api.deps import Caller, ContextDep, JsonBody
from api.problems import problem_responses
from api.schemas import AttemptList, AttemptOut, JobList, JobOut, OutputOut, RetryJob
from projections.domain.lifecycle import JobState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

CURSOR_PATTERN = r"^[0-9]{1,18}$"

Cursor = Annotated[
    str,
    Query(
        pattern=CURSOR_PATTERN,
        description="A `next_cursor` or SSE event id you were given; 0 is the beginning",
    ),
]


@router.get("", response_model=JobList, responses=problem_responses(401, 422))
async def list_jobs(
    caller: Caller,
    ctx: ContextDep,
    since: Cursor = "0",
    state: Annotated[JobState | None, Query(description="Only jobs now in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="At most this many jobs")] = 100,
) -> JobList:
    """Your jobs changed after `since`, oldest change first, each as it stands now, and the
    cursor to pass next. A job that changes again while you page moves to a later page; none
    is skipped. Page until `jobs` is empty to catch up; keep the last `next_cursor`."""
    page = await ctx.store.jobs_changed_since(caller, int(since), limit, state)
    return JobList(
        jobs=[JobOut.listed(job) for job in page.jobs], next_cursor=str(page.next_cursor)
    )


@router.get("/{job_id}", response_model=JobOut, responses=problem_responses(401, 404))
async def read_job(job_id: str, caller: Caller, ctx: ContextDep) -> JobOut:
    return JobOut.of(await ctx.store.job(caller, job_id))


@router.get(
    "/{job_id}/output", response_model=OutputOut, responses=problem_responses(401, 404, 422)
)
async def read_output(
    job_id: str,
    caller: Caller,
    ctx: ContextDep,
    since: Annotated[
        int,
        Query(ge=0, le=2**31, description="Characters of the attempt's text you already have"),
    ] = 0,
) -> OutputOut:
    """The text the job's current attempt has streamed so far, from `since` on, and its tool
    calls so far (whole): the polling fallback of the `job.output` events. If `attempt` is
    not the one your text is of, a new attempt started over: drop your text and use this one
    from offset 0. `done` is true once nothing more will come; a succeeded job's whole output
    is its response's text and tool calls."""
    found = await ctx.store.output(caller, job_id, since)
    return OutputOut(
        job_id=found.job.job_id,
        attempt=found.attempt,
        offset=found.offset,
        text=found.text,
        tool_calls=found.tool_calls,
        done=found.done,
    )


@router.get("/{job_id}/attempts", response_model=AttemptList, responses=problem_responses(401, 404))
async def list_attempts(job_id: str, caller: Caller, ctx: ContextDep) -> AttemptList:
    """Each attempt that has ended, oldest first: its outcome, provider and model, tokens
    (the provider's, or ours where it gave none: `usage_estimated`), cost, time to first
    token and duration. The job row carries the sums. An attempt whose worker died records
    nothing."""
    job, attempts = await ctx.store.attempts(caller, job_id)
    return AttemptList(job_id=job.job_id, attempts=[AttemptOut.model_validate(a) for a in attempts])


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=problem_responses(401, 404, 409),
    summary="Cancel a queued or running job; the job row shows `cancelled` once it has stopped",
    description="202 with the job row: `cancel_requested_at` is set, and `state` is still "
    "`running` while the call is being stopped (then `cancelled`, which follow the job's "
    "events or polling show). A job already settled is a 409.",
)
async def cancel_job(job_id: str, caller: Caller, ctx: ContextDep) -> JobOut:
    return JobOut.of(await ctx.jobs.cancel(caller, job_id))


@router.post(
    "/{job_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses={
        202: {
            "headers": {
                "Location": {
                    "description": "The new job's URL",
                    "schema": {"type": "string"},
                    "required": True,
                }
            }
        },
        **problem_responses(401, 404, 409, 415, 422),
    },
    summary="Run a settled job's prompt again as a new job that supersedes it",
)
async def retry_job(
    job_id: str,
    caller: Caller,
    _json: Annotated[None, JsonBody],
    ctx: ContextDep,
    response: Response,
    body: Annotated[RetryJob | None, Body()] = None,
) -> JobOut:
    """No body (or `{}`) runs the old job's options, priority and max_attempts again; a body
    replaces those it names, validated as a submission's are."""
    job = await ctx.jobs.retry(caller, job_id, body.changes() if body else None)
    response.headers["Location"] = f"/v1/jobs/{job.job_id}"
    return JobOut.of(job)
