"""The projector's rules, on SQLite and PostgreSQL: only legal transitions apply, each once."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select, update

from projections.domain.lifecycle import (
    ALLOWED_TRANSITIONS,
    AttemptResult,
    ErrorKind,
    JobState,
    is_allowed,
)
from projections.errors import InvalidState
from projections.group_commit import WriteTx
from projections.ids import response_id_for
from projections.models import Job, Response
from projections.projector import Transition
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
ANSWER = AttemptResult(text="hi", provider="fake", model="fake-1")


async def queued_job(projection: Projection) -> Job:
    accepted = await projection.store.submit(
        ALICE, Submission(text="hello", priority=50, max_attempts=3, options={})
    )
    return accepted.job


async def states(projection: Projection, job_id: str) -> list[str]:
    return [e.state.value for e in await projection.store.job_events(ALICE, job_id)]


def test_only_the_designed_transitions_are_allowed() -> None:
    allowed = {(a.value, b.value) for a, b in ALLOWED_TRANSITIONS}
    assert allowed == {
        ("queued", "running"), ("queued", "cancelled"), ("queued", "failed"),
        ("running", "succeeded"), ("running", "queued"), ("running", "failed"),
        ("running", "cancelled"),
        ("succeeded", "superseded"), ("failed", "superseded"), ("cancelled", "superseded"),
    }  # fmt: skip
    # queued → failed exists only for the hard ceiling (docs/decisions.md).
    assert not is_allowed(JobState.QUEUED, JobState.FAILED, ErrorKind.AUTH)
    assert is_allowed(JobState.QUEUED, JobState.FAILED, ErrorKind.STUCK)


async def test_submission_writes_a_queued_row_and_its_event(projection: Projection) -> None:
    job = await queued_job(projection)
    row = await projection.store.job(ALICE, job.job_id)
    assert (row.state, row.attempt, row.max_attempts) == (JobState.QUEUED, 0, 3)
    assert await states(projection, job.job_id) == ["queued"]


async def test_repeated_transition_is_a_no_op(projection: Projection) -> None:
    job = await queued_job(projection)
    first = await projection.projector.start_attempt(job.job_id, 1, "w1")
    again = await projection.projector.start_attempt(job.job_id, 1, "w1")
    assert first.applied and not again.applied
    assert await states(projection, job.job_id) == ["queued", "running"]


async def test_older_transition_after_a_newer_one_is_a_no_op(projection: Projection) -> None:
    job = await queued_job(projection)
    await projection.projector.start_attempt(job.job_id, 1, "w1")
    await projection.projector.apply(
        Transition(
            job.job_id, JobState.QUEUED, 1, error_kind=ErrorKind.TIMEOUT, error_message="slow"
        )
    )
    await projection.projector.start_attempt(job.job_id, 2, "w1")
    # Attempt 1's re-queue delivered again, late: it must not undo attempt 2.
    late = await projection.projector.apply(
        Transition(
            job.job_id, JobState.QUEUED, 1, error_kind=ErrorKind.TIMEOUT, error_message="slow"
        )
    )
    assert not late.applied
    row = await projection.store.job(ALICE, job.job_id)
    assert (row.state, row.attempt) == (JobState.RUNNING, 2)


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (JobState.SUCCEEDED, None),
        (JobState.SUPERSEDED, None),
        (JobState.FAILED, ErrorKind.AUTH),
    ],
)
async def test_illegal_transition_from_queued_is_a_no_op(
    projection: Projection, target: JobState, kind: ErrorKind | None
) -> None:
    job = await queued_job(projection)
    result = await projection.projector.apply(Transition(job.job_id, target, error_kind=kind))
    assert not result.applied
    assert await states(projection, job.job_id) == ["queued"]


async def test_terminal_row_never_changes_except_to_superseded_once(
    projection: Projection,
) -> None:
    job = await queued_job(projection)
    await projection.projector.apply(Transition(job.job_id, JobState.CANCELLED))
    for target in (JobState.RUNNING, JobState.QUEUED, JobState.FAILED, JobState.SUCCEEDED):
        result = await projection.projector.apply(
            Transition(job.job_id, target, 1, error_kind=ErrorKind.UNKNOWN)
        )
        assert not result.applied
    new = await projection.store.retry(ALICE, job.job_id)
    with pytest.raises(InvalidState):
        await projection.store.retry(ALICE, job.job_id)
    row = await projection.store.job(ALICE, job.job_id)
    assert (row.state, row.superseded_by) == (JobState.SUPERSEDED, new.job_id)
    assert await states(projection, job.job_id) == ["queued", "cancelled", "superseded"]
    assert (await projection.store.job(ALICE, new.job_id)).supersedes == job.job_id


async def test_response_of_a_cancelled_job_is_discarded(projection: Projection) -> None:
    job = await queued_job(projection)
    await projection.projector.start_attempt(job.job_id, 1, "w1")
    await projection.projector.apply(Transition(job.job_id, JobState.CANCELLED))
    rid = response_id_for(job.job_id)
    late = await projection.projector.succeed(job.job_id, 1, rid, ANSWER)
    assert not late.applied
    async with projection.sessions() as session:
        assert await session.get(Response, rid) is None
    assert (await projection.store.job(ALICE, job.job_id)).state is JobState.CANCELLED


async def test_racing_attempts_keep_exactly_one_result(projection: Projection) -> None:
    job = await queued_job(projection)
    await projection.projector.start_attempt(job.job_id, 1, "w1")
    # w1 is presumed dead; attempt 2 starts on w2 (recorded as worker_crash).
    await projection.projector.start_attempt(job.job_id, 2, "w2")
    rid = response_id_for(job.job_id)
    stale = await projection.projector.succeed(job.job_id, 1, rid, ANSWER)
    current = await projection.projector.succeed(job.job_id, 2, rid, ANSWER)
    repeated = await projection.projector.succeed(job.job_id, 2, rid, ANSWER)
    assert (stale.applied, current.applied, repeated.applied) == (False, True, False)
    async with projection.sessions() as session:
        count = await session.scalar(
            select(func.count()).select_from(Response).where(Response.job_id == job.job_id)
        )
    assert count == 1
    row = await projection.store.job(ALICE, job.job_id)
    assert (row.state, row.attempt, row.response_id) == (JobState.SUCCEEDED, 2, rid)
    assert await states(projection, job.job_id) == [
        "queued", "running", "queued", "running", "succeeded",
    ]  # fmt: skip
    crash = (await projection.store.job_events(ALICE, job.job_id))[2].data
    assert crash["error_kind"] == "worker_crash"


async def test_event_ids_increase_and_are_the_jobs_cursor(projection: Projection) -> None:
    job = await queued_job(projection)
    await projection.projector.start_attempt(job.job_id, 1, "w1")
    events = await projection.store.job_events(ALICE, job.job_id)
    assert [e.id for e in events] == sorted({e.id for e in events})
    row = await projection.store.job(ALICE, job.job_id)
    assert row.last_event_id == events[-1].id


async def test_reads_do_not_wait_for_an_open_write(projection: Projection) -> None:
    """A poll, an SSE query or an API key lookup reads while a write transaction is open;
    only a second writer queues behind it (SQLite: BEGIN IMMEDIATE for writes only)."""
    job = await queued_job(projection)
    writing, release = threading.Event(), threading.Event()

    def slow_write(tx: WriteTx) -> None:
        tx.execute(update(Job).values(priority=7, updated_at=LONG_AGO))
        writing.set()
        release.wait(10)

    writer = asyncio.create_task(projection.projector.writes.run(slow_write))
    assert await asyncio.to_thread(writing.wait, 10)
    try:
        read = await asyncio.wait_for(projection.store.job(ALICE, job.job_id), timeout=5)
        assert read.priority == 50  # the open write is not visible yet
        second = asyncio.create_task(projection.projector.start_attempt(job.job_id, 1, "w1"))
    finally:
        release.set()
        await writer
    assert (await second).applied
    # Had the second writer not waited its turn, the first's commit would have overwritten
    # the row the second wrote: both writes stand, in turn.
    row = await projection.store.job(ALICE, job.job_id)
    assert (row.priority, row.state) == (7, JobState.RUNNING)
    assert row.updated_at > LONG_AGO
