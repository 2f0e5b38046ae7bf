"""Bare Temporal: a trivial workflow running one trivial activity, and its worker process."""

from __future__ import annotations

import asyncio
import signal
import sys
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker


@activity.defn
async def echo(text: str) -> str:
    return text


@workflow.defn
class BareWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(
            echo, text, start_to_close_timeout=timedelta(seconds=30)
        )


async def run_worker(address: str, task_queue: str) -> None:
    """Until SIGTERM: the same worker limits as promptjobs' (max 1000 concurrent activities)."""
    client = await Client.connect(address)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[BareWorkflow],
        activities=[echo],
        max_concurrent_activities=1000,
    ):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(run_worker(sys.argv[1], sys.argv[2]))
