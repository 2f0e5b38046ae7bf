"""Provider budgets' guards on PostgreSQL, where several workers check and draw at once: the
interleavings that could overshoot a bound are forced, and the bound holds."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from projections import budgets
from projections.budgets import BudgetWait, Draw
from projections.group_commit import SyncWriter, WriteTx
from projections.scope import Scope
from projections.spend import Cap
from projections.writes import Submission
from promptjobs.runtime import Projection

ACME = Scope("acme", "root", "admin")
pytestmark = pytest.mark.postgres


@pytest.fixture
def database_url(pg_database: str) -> str:
    """PostgreSQL only: SQLite has one writer at a time, so no two checks interleave."""
    return pg_database


async def two_starts_at_once(
    projection: Projection, first_draw: Draw, second_draw: Draw
) -> tuple[object, object]:
    """Two jobs' attempts start on two writers: the first checks its draw, takes it, and holds
    its transaction open while the second checks (or long enough that the second is surely
    blocked on a lock). What each check answered."""
    store = projection.store
    first_job = (await store.submit(ACME, Submission("first", 50, 3, {}))).job.job_id
    second_job = (await store.submit(ACME, Submission("second", 50, 3, {}))).job.job_id
    first_drew, second_checked = threading.Event(), threading.Event()

    def first(tx: WriteTx) -> object:
        now = datetime.now(UTC)
        room = budgets.check(tx, first_job, first_draw, now, budgets.WINDOW)
        assert isinstance(room, Draw)
        budgets.take(tx, first_job, 1, room, now, budgets.WINDOW)
        first_drew.set()
        second_checked.wait(2)
        return room

    def second(tx: WriteTx) -> object:
        assert first_drew.wait(10)
        try:
            return budgets.check(tx, second_job, second_draw, datetime.now(UTC), budgets.WINDOW)
        finally:
            second_checked.set()

    url = projection.engine.url.render_as_string(hide_password=False)
    writers = [SyncWriter(url), SyncWriter(url)]
    try:
        [first_room], [second_room] = await asyncio.gather(
            asyncio.to_thread(writers[0].run, [first]),
            asyncio.to_thread(writers[1].run, [second]),
        )
    finally:
        for writer in writers:
            writer.dispose()
    return first_room, second_room


async def test_an_orgs_token_quota_holds_across_its_budgets_when_two_attempts_start_at_once(
    projection: Projection,
) -> None:
    """Two attempts of one org on two models, each 80 tokens of the org's 100 a minute: the
    second must see the first's draw (it waits for the org's lock), and wait for room."""

    def draw(budget: str) -> Draw:
        return Draw(budget, 80, 50, 5.0, org="acme", org_tpm=100)

    first_room, second_room = await two_starts_at_once(
        projection, draw("openai/model-a"), draw("openai/model-b")
    )
    assert isinstance(first_room, Draw)
    assert isinstance(second_room, BudgetWait), "both passed the org's quota"
    assert "token quota" in second_room.reason


async def test_a_spend_cap_holds_when_two_workers_start_calls_at_once(
    projection: Projection,
) -> None:
    """Two attempts under an org's $0.10 a day, each may cost $0.08, on two models: the
    second must see the first's hold (it waits for the cap's lock) and wait: the fleet passes
    a cap by no more than what its calls' estimates fell short."""
    cap = Cap("acme", 0.10)

    def draw(budget: str) -> Draw:
        return Draw(budget, 80, 50, 5.0, org="acme", caps=(cap,), usd=0.08)

    first_room, second_room = await two_starts_at_once(
        projection, draw("openai/model-a"), draw("anthropic/model-b")
    )
    assert isinstance(first_room, Draw)
    assert isinstance(second_room, BudgetWait), "both passed the org's spend cap"
    assert "spend cap: $0.0800 of its $0.10" in second_room.reason
