"""A stopping process waits for its parts a bounded time, then cuts the ones still running."""

from __future__ import annotations

import asyncio
import logging

import pytest

from promptjobs.launch import stop_within


async def test_parts_that_heed_stop_end_on_their_own_and_one_that_does_not_is_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()
    ended: list[str] = []

    async def heeds() -> None:
        await stop.wait()
        ended.append("heeds")

    async def misses() -> None:
        try:
            await asyncio.sleep(3600)  # a pass over a backlog that never looks at `stop`
        except asyncio.CancelledError:
            ended.append("misses, cancelled")
            raise

    tasks = [
        asyncio.create_task(heeds(), name="dispatcher"),
        asyncio.create_task(misses(), name="batches"),
    ]
    await asyncio.sleep(0)
    stop.set()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with caplog.at_level(logging.WARNING, logger="promptjobs"):
        await stop_within(tasks, 0.2)
    assert loop.time() - began < 5
    assert ended == ["heeds", "misses, cancelled"]
    assert all(task.done() for task in tasks)
    assert [r.getMessage() for r in caplog.records] == ["batches did not stop in time: cancelled"]


async def test_a_part_that_failed_does_not_stop_the_wait_for_the_others() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def ends() -> None:
        await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(fails()), asyncio.create_task(ends())]
    await stop_within(tasks, 5)
    assert all(task.done() for task in tasks)
    assert not tasks[1].cancelled()
