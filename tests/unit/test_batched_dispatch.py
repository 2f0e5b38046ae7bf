"""The dispatcher notes started workflows in batches: fewer projection writes, none lost."""

from __future__ import annotations

import asyncio

import pytest

from api.dispatch import BatchedWrite
from projections.store import Scope, Submission
from promptjobs.runtime import Projection

ALICE = Scope("acme", "alice", "member")


async def test_concurrent_marks_share_writes_and_all_land(projection: Projection) -> None:
    store = projection.store
    jobs = [
        (await store.submit(ALICE, Submission(f"p{i}", 50, 3, {}))).job.job_id for i in range(40)
    ]
    batches: list[list[str]] = []

    async def write(ids: list[str]) -> None:
        batches.append(ids)
        await store.mark_dispatched(ids)

    marks = BatchedWrite(write)
    await asyncio.gather(*(marks.add(job_id) for job_id in jobs))
    # Every caller returned after its id was committed.
    assert await store.undispatched() == []
    assert sorted(i for batch in batches for i in batch) == sorted(jobs)
    assert len(batches) < len(jobs)


async def test_a_failed_write_reaches_every_caller_of_its_batch() -> None:
    async def write(ids: list[str]) -> None:
        raise OSError("database gone")

    marks = BatchedWrite(write)
    results = await asyncio.gather(marks.add("a"), marks.add("b"), return_exceptions=True)
    assert [type(r) for r in results] == [OSError, OSError]
    # The next batch is written afresh.
    with pytest.raises(OSError):
        await marks.add("c")
