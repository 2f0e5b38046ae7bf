"""Settling an attempt (activities/settle.py), the one way a direct call and a provider
batch's line end: what a failure leads to, and the re-queue, failure and success it writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from activities.settle import Settling
from projections.domain.lifecycle import (
    AttemptResult,
    BackoffPolicy,
    End,
    ErrorKind,
    JobState,
    Retry,
)
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")
POLICY = BackoffPolicy(initial_s=5.0, coefficient=5.0, jitter=0.0)


async def running_job(projection: Projection, max_attempts: int = 3) -> str:
    accepted = await projection.store.submit(
        ALICE, Submission(text="hello", priority=50, max_attempts=max_attempts, options={})
    )
    await projection.projector.start_attempt(accepted.job.job_id, 1, "w1")
    return accepted.job.job_id


def test_a_retryable_failure_with_attempts_left_retries_after_the_backoff() -> None:
    settling = Settling(store=None, backoff=POLICY)  # type: ignore[arg-type]
    step = settling.next_step(ErrorKind.PROVIDER_5XX, "down", 1, 3)
    assert step == Retry(5.0)
    assert settling.next_step(ErrorKind.PROVIDER_5XX, "down", 3, 3) == End(
        ErrorKind.PROVIDER_5XX, "down"
    )
    assert isinstance(settling.next_step(ErrorKind.AUTH, "no key", 1, 3), End)


async def test_a_requeue_keeps_the_error_and_the_next_attempts_time(
    projection: Projection,
) -> None:
    job_id = await running_job(projection)
    settling = Settling(projection.store, POLICY)
    before = datetime.now(UTC)
    at = await settling.requeue(job_id, 1, ErrorKind.TIMEOUT, "slow", delay_s=25)
    row = await projection.store.job(ALICE, job_id)
    assert (row.state, row.error_kind, row.error_message) == (
        JobState.QUEUED,
        ErrorKind.TIMEOUT,
        "slow",
    )
    assert row.next_attempt_at == at and at >= before + timedelta(seconds=25)


@pytest.mark.parametrize("outcome", ["failed", "succeeded"])
async def test_an_attempt_settles_the_job_once(projection: Projection, outcome: str) -> None:
    job_id = await running_job(projection)
    settling = Settling(projection.store, POLICY)
    if outcome == "failed":
        first = await settling.fail(job_id, ErrorKind.AUTH, "no key")
        again = await settling.fail(job_id, ErrorKind.AUTH, "no key")
    else:
        answer = AttemptResult(text="hi", provider="fake", model="fake-1")
        first = await settling.succeed(job_id, 1, answer)
        again = await settling.succeed(job_id, 1, answer)
    assert first.applied and not again.applied
    assert (await projection.store.job(ALICE, job_id)).state == JobState(outcome)
