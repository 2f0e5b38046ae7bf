"""Bare Temporal: a trivial workflow running one trivial activity, its worker process, and
the run that times it (the yardstick the throughput and concurrency figures are read by)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import Priority, SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    # As workflows/prompt_job.py imports it: passed through, not loaded afresh per workflow.
    import workflows.search_attributes as sa


@activity.defn
async def echo(text: str, sleep_s: float) -> str:
    await asyncio.sleep(sleep_s)
    return text


@workflow.defn
class BareWorkflow:
    """One activity. `shaped`: with what our job's workflow asks of the server besides (its
    three patches, each a marker and an upsert of TemporalChangeVersion by the SDK; a
    heartbeat timeout and a schedule-to-close; its state upserted at the end; started with
    our search attributes and a priority and fairness key), so the engine's cost of that
    shape can be told from our processes' cost."""

    @workflow.run
    async def run(self, text: str, sleep_s: float, shaped: bool = False) -> str:
        if not shaped:
            return await workflow.execute_activity(
                echo, args=[text, sleep_s], start_to_close_timeout=timedelta(seconds=30)
            )
        for patch in ("one", "two", "three"):
            workflow.patched(patch)
        result = await workflow.execute_activity(
            echo,
            args=[text, sleep_s],
            schedule_to_close_timeout=timedelta(minutes=10),
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=10),
        )
        workflow.upsert_search_attributes(
            [sa.JOB_STATE.value_set("succeeded"), sa.ATTEMPT.value_set(1)]
        )
        return result


def shaped_attributes(i: int) -> TypedSearchAttributes:
    """What our jobs' workflows start with (workflows/prompt_job.initial_search_attributes)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(sa.JOB_STATE, "queued"),
            SearchAttributePair(sa.ORG, "bench"),
            SearchAttributePair(sa.PROMPT_ID, f"pmt_bare_{i}"),
            SearchAttributePair(sa.PRIORITY, 50),
            SearchAttributePair(sa.ATTEMPT, 0),
        ]
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


async def bare_temporal(
    env: WorkflowEnvironment,
    jobs: int,
    concurrency: int,
    sleep_s: float = 0.0,
    timeout: float = 600,
    *,
    shaped: bool = False,
) -> tuple[float, str]:
    """Seconds from the first start_workflow to the last workflow completed, and whose CPU
    it took: `jobs` bare workflows started `concurrency` at a time, one worker process (this
    module's)."""
    from bench.harness import CpuMeter, target, wait_for_pollers

    task_queue = f"bare-{uuid.uuid4().hex[:8]}"
    # Popen returns at once; the bench starts this one process before it measures.
    worker = subprocess.Popen([sys.executable, "-m", "bench.bare", target(env), task_queue])  # noqa: ASYNC220
    try:
        await wait_for_pollers(env, task_queue)
        meter = CpuMeter()
        began = time.monotonic()
        starts = iter(range(jobs))

        async def starter() -> None:
            for i in starts:
                await env.client.start_workflow(
                    BareWorkflow.run,
                    args=[f"bare {i}", sleep_s, shaped],
                    id=f"{task_queue}-{i}",
                    task_queue=task_queue,
                    search_attributes=shaped_attributes(i) if shaped else None,
                    # As the dispatcher starts ours: a priority key and the org as fairness key.
                    priority=Priority(priority_key=51, fairness_key="bench")
                    if shaped
                    else Priority.default,
                )

        await asyncio.gather(*(starter() for _ in range(concurrency)))
        # Counted like our jobs (polled, not thousands of long-polls, which the server refuses).
        query = f"TaskQueue = '{task_queue}' AND ExecutionStatus = 'Completed'"
        deadline = began + timeout
        while (await env.client.count_workflows(query)).count < jobs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare workflows not all completed within {timeout} s")
            await asyncio.sleep(0.2)
        return time.monotonic() - began, meter.per(jobs)
    finally:
        worker.terminate()
        worker.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(run_worker(sys.argv[1], sys.argv[2]))
