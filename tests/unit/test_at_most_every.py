"""A worker's periodic reads (fleet share, provider budgets) run once however many attempts
ask at the same moment."""

from __future__ import annotations

import asyncio

import pytest

from activities.stale import AtMostEvery


async def test_attempts_asking_at_once_share_one_read() -> None:
    reads = 0

    async def read() -> None:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.05)

    every = AtMostEvery(60.0, read)
    await asyncio.gather(*(every() for _ in range(100)))
    assert reads == 1
    await every()  # fresh: no read
    assert reads == 1


async def test_a_stale_read_runs_again_and_a_failed_one_is_retried() -> None:
    reads = 0

    async def read() -> None:
        nonlocal reads
        reads += 1
        if reads == 2:
            raise RuntimeError("database said no")

    every = AtMostEvery(0.0, read)
    await every()
    with pytest.raises(RuntimeError):
        await every()
    await every()
    assert reads == 3


async def test_one_caller_cancelled_does_not_cancel_the_read_for_the_others() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    done = False

    async def read() -> None:
        nonlocal done
        started.set()
        await release.wait()
        done = True

    every = AtMostEvery(60.0, read)
    first = asyncio.create_task(every())
    await started.wait()
    second = asyncio.create_task(every())
    first.cancel()
    release.set()
    await second
    assert done
