"""The event cursor never skips an event, however writers interleave their commits.

Writers on connections of their own (as separate worker processes have) commit transitions
with random delays inside their transactions, so transactions that took event ids early
commit late; a reader pages through the log and through `?since=` meanwhile. On PostgreSQL
the writers commit concurrently (no global lock); on SQLite they take turns.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest
from sqlalchemy import select

from projections.domain.lifecycle import ErrorKind, JobState
from projections.group_commit import GroupCommit, SyncWriter, WriteTx
from projections.models import JobEvent
from projections.projector import Transition, transition, utcnow
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ADMIN = Scope("acme", "root", "admin")
WRITERS = 6
JOBS_PER_WRITER = 12


def lifecycle_of(job_id: str) -> list[Transition]:
    """Three transactions' worth of one job: started, re-queued, started again and settled."""
    return [
        Transition(job_id, JobState.RUNNING, 1, worker="w"),
        Transition(job_id, JobState.QUEUED, 1, error_kind=ErrorKind.TIMEOUT, error_message="x"),
        Transition(job_id, JobState.RUNNING, 2, worker="w"),
        Transition(job_id, JobState.SUCCEEDED, 2, response_id="r", require_current_attempt=True),
    ]


def write_slowly(url: str, jobs: list[str], seed: int) -> None:
    """One writer: its own connection, transactions of one to three transitions, each held
    open for a random while before it commits."""
    rng = random.Random(seed)
    writer = SyncWriter(url)
    # Round-robin over the writer's jobs: each job's transitions in their own order.
    stages = zip(*(lifecycle_of(job_id) for job_id in jobs), strict=True)
    steps = [t for stage in stages for t in stage]
    try:
        while steps:
            take = rng.randint(1, 3)
            batch, steps = steps[:take], steps[take:]

            def write(tx: WriteTx, batch: list[Transition] = batch) -> None:
                for t in batch:
                    assert transition(tx, t, utcnow()) is not None, t
                time.sleep(rng.uniform(0, 0.03))

            writer.run([write])
    finally:
        writer.dispose()


async def test_a_paging_reader_sees_every_event_once_while_writers_commit_out_of_order(
    projection: Projection,
) -> None:
    store = projection.store
    jobs = [
        (await store.submit(ADMIN, Submission(f"p{i}", 50, 3, {}))).job.job_id
        for i in range(WRITERS * JOBS_PER_WRITER)
    ]
    start = await store.latest_event_id()
    url = projection.engine.url.render_as_string(hide_password=False)
    done = threading.Event()

    def run_writers() -> None:
        threads = [
            threading.Thread(
                target=write_slowly, args=(url, jobs[i::WRITERS], i), name=f"writer-{i}"
            )
            for i in range(WRITERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()

    writers = asyncio.create_task(asyncio.to_thread(run_writers))
    seen: list[int] = []
    polled: dict[str, Any] = {}
    cursor = poll_cursor = start
    while True:
        finished = done.is_set()  # read before the last pages: nothing commits after it
        while page := await store.events_since(ADMIN, cursor, limit=5):
            seen += [event.id for event in page]
            cursor = page[-1].id
        while (changed := await store.jobs_changed_since(ADMIN, poll_cursor, 5)).jobs:
            polled.update({job.job_id: job.state for job in changed.jobs})
            poll_cursor = changed.next_cursor
        poll_cursor = changed.next_cursor
        if finished:
            break
        await asyncio.sleep(0.005)
    await writers

    async with projection.sessions() as session:
        logged = list(
            (await session.execute(select(JobEvent.id).where(JobEvent.id > start))).scalars()
        )
    assert len(logged) == len(jobs) * 4
    assert sorted(seen) == sorted(logged)  # every event, none twice
    assert seen == sorted(seen)  # in cursor order
    assert polled == {job_id: JobState.SUCCEEDED for job_id in jobs}


async def test_a_jobs_events_keep_its_order_when_a_batch_took_its_ids_before_another_writer(
    projection: Projection,
) -> None:
    """Forced: a group commit takes its event ids (its first write), another writer (a second
    worker process) re-queues a job and commits, then the batch cancels that job. The cancel
    came last, so its event must come last in the log, as it does on the row."""
    if projection.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: no transaction takes ids before another")
    store = projection.store
    held = (await store.submit(ADMIN, Submission("held", 50, 3, {}))).job.job_id
    raced = (await store.submit(ADMIN, Submission("raced", 50, 3, {}))).job.job_id
    await projection.projector.start_attempt(raced, 1, "w1")
    has_ids, other_committed = threading.Event(), threading.Event()

    def first_write(tx: WriteTx) -> None:
        transition(tx, Transition(held, JobState.CANCELLED), utcnow())
        has_ids.set()
        other_committed.wait(10)

    def cancel(tx: WriteTx) -> Any:
        return transition(tx, Transition(raced, JobState.CANCELLED), utcnow())

    batch = GroupCommit(projection.sessions)
    both = asyncio.gather(batch.run(first_write), batch.run(cancel))
    assert await asyncio.to_thread(has_ids.wait, 10)
    other = SyncWriter(projection.engine.url.render_as_string(hide_password=False))
    requeue = Transition(raced, JobState.QUEUED, 1, error_kind=ErrorKind.TIMEOUT, error_message="x")
    try:
        await asyncio.to_thread(other.run, [lambda tx: transition(tx, requeue, utcnow())])
    finally:
        other.dispose()
    other_committed.set()
    await both

    events = await store.job_events(ADMIN, raced)
    assert [e.state for e in events] == [
        JobState.QUEUED, JobState.RUNNING, JobState.QUEUED, JobState.CANCELLED,
    ]  # fmt: skip
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert (await store.job(ADMIN, raced)).state is JobState.CANCELLED
