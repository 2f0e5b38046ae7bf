"""Gathering deferrable jobs into provider batches (projections/provider_batches.py
`gather`, which services/batching.py's gatherer runs): which jobs a batch takes, and when.
No service runs: the store, on each database."""

from __future__ import annotations

from projections.domain.lifecycle import JobState
from projections.projector import Transition
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ACME = Scope("acme", "alice", "member")
LONG = 3600.0  # a wait no test reaches


async def deferred(projection: Projection, text: str, model: str = "gpt-test") -> str:
    accepted = await projection.store.submit(ACME, Submission(text, 50, 3, {"deferrable": True}))
    await projection.store.provider_batches.defer(accepted.job, "openai", model)
    return accepted.job.job_id


async def members(projection: Projection, batch_id: str) -> list[str]:
    return [m.job.job_id for m in await projection.store.provider_batches.members(batch_id)]


async def test_a_full_batch_leaves_at_once_oldest_first_and_the_rest_waits_its_time(
    projection: Projection,
) -> None:
    batches = projection.store.provider_batches
    jobs = [await deferred(projection, f"p{i}") for i in range(5)]
    [full, second] = await batches.gather(2, LONG)
    assert (full.provider, full.model, full.jobs, full.state) == (
        "openai",
        "gpt-test",
        2,
        "gathered",
    )
    assert sorted(await members(projection, full.batch_id)) == sorted(jobs[:2])
    assert sorted(await members(projection, second.batch_id)) == sorted(jobs[2:4])
    # The fifth is alone: not due until the oldest waiting has waited max_wait_s.
    assert await batches.gather(2, LONG) == []
    [rest] = await batches.gather(2, 0.0)
    assert await members(projection, rest.batch_id) == [jobs[4]]
    # Each job is claimed once.
    assert await batches.gather(2, 0.0) == []


async def test_a_batch_is_of_one_provider_and_model_and_drops_jobs_settled_meanwhile(
    projection: Projection,
) -> None:
    mini = [await deferred(projection, f"mini {i}", "gpt-mini") for i in range(2)]
    big = await deferred(projection, "big", "gpt-big")
    cancelled = await deferred(projection, "cancelled", "gpt-big")
    await projection.projector.apply(Transition(cancelled, JobState.CANCELLED))

    made = await projection.store.provider_batches.gather(10, 0.0)

    by_model = {batch.model: batch for batch in made}
    assert sorted(by_model) == ["gpt-big", "gpt-mini"]
    assert sorted(await members(projection, by_model["gpt-mini"].batch_id)) == sorted(mini)
    assert await members(projection, by_model["gpt-big"].batch_id) == [big]
    assert by_model["gpt-big"].jobs == 1


async def test_a_repeated_deferral_changes_nothing_and_says_why_the_job_waits(
    projection: Projection,
) -> None:
    job_id = await deferred(projection, "once")
    job = await projection.store.job(ACME, job_id)
    again = await projection.store.provider_batches.defer(job, "openai", "gpt-test")
    assert (again.job_id, again.batch_id) == (job_id, None)
    assert job.waiting_for == "deferrable: waiting for a provider batch of openai/gpt-test"
    [batch] = await projection.store.provider_batches.gather(10, 0.0)
    assert await members(projection, batch.batch_id) == [job_id]
