"""Jobs: read one, list changes after a cursor, cancel, retry."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from api.deps import Caller, ServicesDep
from api.problems import Problem, not_found
from api.routes.prompts import PROBLEMS
from api.schemas import JobList, JobOut
from projections.states import JobState
from projections.store import InvalidState, NotFound

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

Cursor = Annotated[
    str,
    Query(pattern=r"^\d{1,18}$", description="A `next_cursor` or SSE event id; 0 is the start"),
]


@router.get("", response_model=JobList, responses=PROBLEMS)
async def list_jobs(
    caller: Caller,
    services: ServicesDep,
    since: Cursor = "0",
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JobList:
    """The caller's jobs changed after `since`, in change order. A job that changes again
    while you page moves to a later page; none is skipped."""
    cursor = int(since)
    jobs = await services.store.jobs_changed_since(caller, cursor, limit, state)
    next_cursor = jobs[-1].last_event_id if jobs else cursor
    return JobList(jobs=[JobOut.of(job) for job in jobs], next_cursor=str(next_cursor))


@router.get("/{job_id}", response_model=JobOut, responses=PROBLEMS)
async def read_job(job_id: str, caller: Caller, services: ServicesDep) -> JobOut:
    try:
        return JobOut.of(await services.store.job(caller, job_id))
    except NotFound as err:
        raise not_found("job", job_id) from err


def _conflict(err: InvalidState) -> Problem:
    return Problem(
        409,
        "invalid_state",
        f"Cannot {err.action} a {err.state.value} job",
        str(err),
        job_id=err.job_id,
        state=err.state.value,
    )


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=PROBLEMS,
    summary="Cancel a queued or running job; the job row shows `cancelled` once it has stopped",
)
async def cancel_job(job_id: str, caller: Caller, services: ServicesDep) -> JobOut:
    try:
        return JobOut.of(await services.jobs.cancel(caller, job_id))
    except NotFound as err:
        raise not_found("job", job_id) from err
    except InvalidState as err:
        raise _conflict(err) from err


@router.post(
    "/{job_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=PROBLEMS,
    summary="Run a settled job's prompt again as a new job that supersedes it",
)
async def retry_job(
    job_id: str, caller: Caller, services: ServicesDep, response: Response
) -> JobOut:
    try:
        job = await services.jobs.retry(caller, job_id)
    except NotFound as err:
        raise not_found("job", job_id) from err
    except InvalidState as err:
        raise _conflict(err) from err
    response.headers["Location"] = f"/v1/jobs/{job.job_id}"
    return JobOut.of(job)
