"""Admission (projections/admission.py): each org's share of the fleet, as the transaction
that starts a job's first attempt decides it, and whom the dispatcher wakes when a slot
frees. No service runs: the projector and the store, on each database."""

from __future__ import annotations

from projections.admission import fleet_share
from projections.domain.lifecycle import ErrorKind, JobState
from projections.projector import Transition
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True


def test_an_orgs_default_share_is_its_fair_part_of_the_live_fleet() -> None:
    # No worker known: the configured limit (0: none).
    assert (fleet_share(0, 0, 3), fleet_share(4, 0, 3)) == (0, 4)
    # Alone, all but a tenth of the fleet, so the next org finds a slot at once.
    assert fleet_share(0, 20, 1) == 18
    # Three orgs at work: an equal part each, rounded up.
    assert fleet_share(0, 20, 3) == 7
    # The configured limit, where it is smaller; one slot is always one.
    assert (fleet_share(5, 20, 1), fleet_share(0, 1, 4)) == (5, 1)


async def queued(projection: Projection, org: str, priority: int = 50) -> str:
    scope = Scope(org, "u", "member")
    submitted = await projection.store.submit(scope, Submission(f"{org} job", priority, 3, {}))
    return submitted.job.job_id


async def test_a_job_past_its_orgs_limit_waits_saying_why_and_takes_the_freed_slot(
    projection: Projection,
) -> None:
    await projection.store.orgs.set_limit("acme", 1)
    first, second = await queued(projection, "acme"), await queued(projection, "acme")
    other = await queued(projection, "globex")
    starts = projection.projector.start_attempt

    assert (await starts(first, 1, "w1", org_limit=0)).state is JobState.RUNNING
    refused = await starts(second, 1, "w1", org_limit=0)
    assert refused.state is JobState.QUEUED and refused.waiting is not None
    assert (refused.waiting.org, refused.waiting.running, refused.waiting.limit) == ("acme", 1, 1)
    assert "acme has 1 of its 1 jobs running" in refused.waiting.describe()
    # Another org's job does not queue behind acme's.
    assert (await starts(other, 1, "w1", org_limit=0)).state is JobState.RUNNING
    # The slot is held until the job settles, and freed by the commit that settles it.
    await projection.projector.apply(
        Transition(first, JobState.FAILED, error_kind=ErrorKind.AUTH, error_message="no key")
    )
    assert (await starts(second, 1, "w1", org_limit=0)).state is JobState.RUNNING


async def test_the_default_limit_binds_an_org_without_one_of_its_own(
    projection: Projection,
) -> None:
    jobs = [await queued(projection, "acme") for _ in range(3)]
    started = [await projection.projector.start_attempt(j, 1, "w1", org_limit=2) for j in jobs]
    assert [a.state for a in started] == [JobState.RUNNING, JobState.RUNNING, JobState.QUEUED]
    [share] = await projection.store.orgs.shares(default_limit=2)
    assert (share.org, share.limit, share.own_limit, share.running, share.waiting) == (
        "acme",
        2,
        False,
        2,
        1,
    )


async def test_the_waiters_woken_are_as_many_as_each_org_has_free_slots_most_urgent_first(
    projection: Projection,
) -> None:
    await projection.store.orgs.set_limit("acme", 2)
    running = await queued(projection, "acme")
    started = await projection.projector.start_attempt(running, 1, "w1", org_limit=0)
    assert started.state is JobState.RUNNING
    # Refused while acme's limit is 1; then it is 2 again: one slot free for three waiters.
    await projection.store.orgs.set_limit("acme", 1)
    waiters = {priority: await queued(projection, "acme", priority) for priority in (70, 10, 40)}
    for job_id in waiters.values():
        assert (await projection.projector.start_attempt(job_id, 1, "w1", org_limit=0)).waiting
    assert await projection.store.orgs.slot_waiters(default_limit=0) == []
    await projection.store.orgs.set_limit("acme", 2)
    assert await projection.store.orgs.slot_waiters(default_limit=0) == [waiters[10]]
    # No limit of its own and none by default: every waiter, most urgent first.
    await projection.store.orgs.set_limit("acme", None)
    woken = await projection.store.orgs.slot_waiters(default_limit=0)
    assert woken == [waiters[10], waiters[40], waiters[70]]


async def test_a_token_quota_is_kept_beside_the_running_limit(projection: Projection) -> None:
    await projection.store.orgs.set_limit("acme", 3)
    await projection.store.orgs.set_token_quota("acme", 500)
    await projection.store.orgs.set_limit("acme", None)
    [share] = await projection.store.orgs.shares(default_limit=4)
    assert (share.limit, share.own_limit, share.tpm) == (4, False, 500)
    assert await projection.store.budgets.org_quotas() == {"acme": 500}
    await projection.store.orgs.set_token_quota("acme", None)
    assert await projection.store.budgets.org_quotas() == {}
