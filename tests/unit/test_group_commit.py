"""Concurrent projection writes share transactions; each caller still hears only of its own."""

from __future__ import annotations

import asyncio
import threading

import pytest

from projections.domain.lifecycle import JobState
from projections.group_commit import GroupCommit, WriteTx
from projections.projector import Transition
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")


async def test_concurrent_submits_share_commits_and_all_land(projection: Projection) -> None:
    sessions: list[int] = []
    writes = projection.projector.writes
    run = writes.run

    async def counting(write):  # type: ignore[no-untyped-def]
        def wrapped(tx: WriteTx):  # type: ignore[no-untyped-def]
            sessions.append(id(tx))
            return write(tx)

        return await run(wrapped)

    writes.run = counting  # type: ignore[method-assign]
    accepted = await asyncio.gather(
        *(projection.store.submit(ALICE, Submission(f"p{i}", 50, 3, {})) for i in range(40))
    )
    assert len(sessions) == 40
    assert len(set(sessions)) < 40  # fewer transactions than submits
    page = await projection.store.undispatched()
    assert sorted(job.job_id for job in page) == sorted(a.job.job_id for a in accepted)


async def test_a_failing_write_reaches_only_its_caller(projection: Projection) -> None:
    jobs = [
        (await projection.store.submit(ALICE, Submission(f"p{i}", 50, 3, {}))).job.job_id
        for i in range(5)
    ]
    starts = [projection.projector.start_attempt(job_id, 1, "w1") for job_id in jobs]
    results = await asyncio.gather(
        *starts[:2],
        projection.projector.apply(Transition("job_missing", JobState.CANCELLED)),
        *starts[2:],
        return_exceptions=True,
    )
    assert isinstance(results[2], LookupError)
    assert [r.state for r in results if not isinstance(r, BaseException)] == [JobState.RUNNING] * 5
    for job_id in jobs:
        assert (await projection.store.job(ALICE, job_id)).state is JobState.RUNNING


async def test_a_write_whose_caller_left_before_its_turn_is_not_run(
    projection: Projection,
) -> None:
    writes = GroupCommit(projection.sessions)
    ran: list[str] = []
    first_holds = threading.Event()
    release = threading.Event()

    # Writes run in a thread, on the transaction's connection: these wait on thread events.
    def slow(tx: WriteTx) -> None:
        ran.append("first")
        first_holds.set()
        release.wait(timeout=30)

    def second(tx: WriteTx) -> None:
        ran.append("second")

    def third(tx: WriteTx) -> None:
        ran.append("third")

    first = asyncio.create_task(writes.run(slow))
    await asyncio.to_thread(first_holds.wait, 30)
    waiting = asyncio.create_task(writes.run(second))
    await asyncio.sleep(0)
    waiting.cancel()
    later = asyncio.create_task(writes.run(third))
    release.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # Writes run in the order they were asked for: once the one asked after it has run, the
    # abandoned write's turn has passed.
    await later
    assert ran == ["first", "third"]


async def test_a_burst_of_dispatch_marks_all_land(projection: Projection) -> None:
    store = projection.store
    jobs = [
        (await store.submit(ALICE, Submission(f"p{i}", 50, 3, {}))).job.job_id for i in range(40)
    ]
    await asyncio.gather(*(store.mark_dispatched(job_id) for job_id in jobs))
    assert await store.undispatched() == []


async def test_submits_sent_at_the_commit_still_answer_each_caller(
    projection: Projection,
) -> None:
    """A group commit's submits insert their prompts, jobs and events together at its
    commit (WriteTx.defer): a key used twice in one batch fails there, and only its own
    caller hears of it (the second is answered as a replay of the first)."""
    writes = projection.projector.writes
    batches: list[int] = []
    run = writes.writer.run

    def counting(batch, max_hold_s=None):  # type: ignore[no-untyped-def]
        batches.append(len(batch))
        return run(batch, max_hold_s)

    writes.writer.run = counting  # type: ignore[method-assign]
    keyed = Submission("same", 50, 3, {}, idempotency_key="k-twice")
    accepted = await asyncio.gather(
        *(projection.store.submit(ALICE, Submission(f"p{i}", 50, 3, {})) for i in range(10)),
        projection.store.submit(ALICE, keyed),
        projection.store.submit(ALICE, keyed),
    )
    assert max(batches) > 1  # they shared a transaction, and it failed at its commit
    first, second = accepted[-2:]
    assert first.job.job_id == second.job.job_id and first.created != second.created
    page = await projection.store.undispatched()
    assert len({job.job_id for job in page}) == 11
    for submitted in accepted:
        job = await projection.store.job(ALICE, submitted.job.job_id)
        events = await projection.store.job_events(ALICE, job.job_id)
        assert job.state is JobState.QUEUED and [e.state for e in events] == [JobState.QUEUED]
