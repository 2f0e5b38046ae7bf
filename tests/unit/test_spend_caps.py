"""Spend caps in the projection, on SQLite and PostgreSQL: a call starts only if what its org's
(and its key's) day has spent and holds leaves room for what it may cost; its hold gives way
to what it did cost when its attempt is recorded; a job that does not fit waits naming the cap
and its reset, and is woken when the cap is raised."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from projections.budgets import BudgetWait, Draw
from projections.domain.lifecycle import JobState
from projections.models import Job, Prompt
from projections.scope import Scope
from projections.spend import Cap, resets_at
from projections.streams import AttemptUsage
from projections.writes import Submission
from promptjobs.wiring import Projection

# Caps are held by every worker at once: each test runs on PostgreSQL too.
BOTH_DATABASES = True

ACME = Scope("acme", "alice", "member", key_id="key1")
PLACE = "openai/gpt-4o"


async def submitted(projection: Projection, scope: Scope = ACME) -> str:
    accepted = await projection.store.submit(scope, Submission("hello", 50, 3, {}))
    return accepted.job.job_id


def costing(usd: float, *caps: Cap) -> object:
    def draw_of(job: Job, prompt: Prompt) -> Draw:
        return Draw(PLACE, 100, 50, 5.0, org=job.org, caps=caps, usd=usd, key_id=job.key_id)

    return draw_of


async def start(projection: Projection, job_id: str, draw_of: object, attempt: int = 1) -> object:
    started = await projection.projector.start_attempt(
        job_id,
        attempt,
        "worker-1",
        draw_of=draw_of,  # type: ignore[arg-type]
    )
    return started.budget_wait if started.budget_wait is not None else started.state


async def ended(projection: Projection, job_id: str, usd: float | None, attempt: int = 1) -> None:
    now = datetime.now(UTC)
    usage = AttemptUsage(
        job_id, attempt, "acme", "succeeded", "openai", "gpt-4o", 10, 10, False, usd, 0,
        None, 100, now, now,
    )  # fmt: skip
    await projection.projector.end_attempt(None, usage)


async def test_a_call_holds_what_it_may_cost_and_its_record_takes_the_holds_place(
    projection: Projection,
) -> None:
    await projection.store.spend_caps.set_org_cap("acme", 0.05)
    cap = Cap("acme", 0.05)
    first, second = await submitted(projection), await submitted(projection)
    assert await start(projection, first, costing(0.03, cap)) is JobState.RUNNING
    # The first holds $0.03 of the $0.05: the second's $0.03 does not fit.
    wait = await start(projection, second, costing(0.03, cap))
    assert isinstance(wait, BudgetWait) and wait.spend
    assert "org acme's spend cap: $0.0300 of its $0.05 a day" in wait.reason
    assert wait.until == resets_at(datetime.now(UTC))
    job = await projection.store.job(ACME, second)
    assert job.state is JobState.QUEUED and job.waiting_for == wait.reason[:1000]
    [standing] = await projection.store.spend_caps.standings(datetime.now(UTC))
    assert (standing.held, standing.spent, standing.waiting) == (0.03, 0.0, 1)

    # The first cost $0.01 in the end: its record replaces its hold, and the second fits.
    await ended(projection, first, 0.01)
    assert await projection.store.spend_caps.spent(cap, datetime.now(UTC)) == 0.01
    assert await start(projection, second, costing(0.03, cap)) is JobState.RUNNING
    assert await projection.store.spend_caps.spent(cap, datetime.now(UTC)) == 0.04


async def test_a_keys_cap_binds_its_own_jobs_and_the_orgs_binds_them_all(
    projection: Projection,
) -> None:
    org_cap, key_cap = Cap("acme", 1.0), Cap("acme", 0.02, key_id="key1")
    mine = await submitted(projection)
    theirs = await submitted(projection, Scope("acme", "bob", "member", key_id="key2"))
    assert await start(projection, mine, costing(0.02, org_cap, key_cap)) is JobState.RUNNING
    again = await submitted(projection)
    wait = await start(projection, again, costing(0.01, org_cap, key_cap))
    assert isinstance(wait, BudgetWait) and "API key key1's spend cap" in wait.reason
    # Another key of the org has room under the org's cap.
    assert await start(projection, theirs, costing(0.5, org_cap)) is JobState.RUNNING
    over = await submitted(projection, Scope("acme", "bob", "member", key_id="key2"))
    wait = await start(projection, over, costing(0.49, org_cap))
    assert isinstance(wait, BudgetWait) and "org acme's spend cap" in wait.reason


async def test_raising_the_cap_wakes_the_longest_waiting_as_the_room_allows(
    projection: Projection,
) -> None:
    caps = projection.store.spend_caps
    await caps.set_org_cap("acme", 0.01)
    [cap] = (await caps.caps()).of("acme", None)
    running = await submitted(projection)
    assert await start(projection, running, costing(0.01, cap)) is JobState.RUNNING
    waiting = [await submitted(projection) for _ in range(3)]
    for job_id in waiting:
        assert isinstance(await start(projection, job_id, costing(0.01, cap)), BudgetWait)
    assert await caps.to_wake(datetime.now(UTC)) == []

    await caps.set_org_cap("acme", 0.03)
    assert await caps.to_wake(datetime.now(UTC)) == waiting[:2]
    await caps.set_org_cap("acme", None)
    assert await caps.to_wake(datetime.now(UTC)) == waiting


async def test_yesterdays_spending_and_a_dead_workers_old_hold_count_no_more(
    projection: Projection,
) -> None:
    cap = Cap("acme", 0.05)
    job_id = await submitted(projection)
    assert await start(projection, job_id, costing(0.05, cap)) is JobState.RUNNING
    now = datetime.now(UTC)
    assert await projection.store.spend_caps.spent(cap, now) == 0.05
    # The next UTC day: the hold (its worker died, say) is yesterday's.
    assert await projection.store.spend_caps.spent(cap, now + timedelta(days=1)) == 0.0


async def test_a_call_on_a_model_without_a_price_waits_naming_it(projection: Projection) -> None:
    job_id = await submitted(projection)
    wait = await start(projection, job_id, costing(None, Cap("acme", 1.0)))  # type: ignore[arg-type]
    assert isinstance(wait, BudgetWait) and "has no price" in wait.reason
    assert await projection.store.spend_caps.to_wake(datetime.now(UTC)) == []
