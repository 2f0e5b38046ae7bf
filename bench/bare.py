"""Bare Temporal: a trivial workflow running one trivial activity, its worker process, and
the run that times it (the yardstick the throughput and concurrency figures are read by)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
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


# The parts of our job's workflow that ask more of the server than one activity does, each
# of which `bench.shape` adds alone: its patch (a marker, and an upsert of
# TemporalChangeVersion by the SDK; workflows started before `patches-2026-12` took four);
# a heartbeat timeout and a schedule-to-close on the activity; its state upserted at the
# end; and, at the start, our search attributes and a priority and fairness key.
ONE_PATCH = "one patch"
FOUR_PATCHES = "four patches"
TIMEOUTS = "timeouts"
FINAL_UPSERT = "final upsert"
START_ATTRIBUTES = "start attributes"
PRIORITY = "priority"
OUR_SHAPE = (ONE_PATCH, TIMEOUTS, FINAL_UPSERT, START_ATTRIBUTES, PRIORITY)


@workflow.defn
class BareWorkflow:
    """One activity; with `shape`, also those parts of our job's workflow (OUR_SHAPE), so the
    engine's cost of that shape can be told from our processes' cost."""

    @workflow.run
    async def run(self, text: str, sleep_s: float, shape: list[str] | None = None) -> str:
        shape = shape or []
        if ONE_PATCH in shape:
            workflow.patched("one")
        if FOUR_PATCHES in shape:
            for patch in ("one", "two", "three", "four"):
                workflow.patched(patch)
        timeouts = TIMEOUTS in shape
        result = await workflow.execute_activity(
            echo,
            args=[text, sleep_s],
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=timedelta(minutes=10) if timeouts else None,
            heartbeat_timeout=timedelta(seconds=10) if timeouts else None,
        )
        if FINAL_UPSERT in shape:
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
    shape: Sequence[str] = (),
) -> tuple[float, str]:
    """Seconds from the first start_workflow to the last workflow completed, and whose CPU
    it took: `jobs` bare workflows (with those parts of our workflow's `shape`) started
    `concurrency` at a time, one worker process (this module's)."""
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
                    args=[f"bare {i}", sleep_s, list(shape)],
                    id=f"{task_queue}-{i}",
                    task_queue=task_queue,
                    search_attributes=shaped_attributes(i) if START_ATTRIBUTES in shape else None,
                    # As the dispatcher starts ours: a priority key and the org as fairness key.
                    priority=Priority(priority_key=51, fairness_key="bench")
                    if PRIORITY in shape
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
    # The worker has shut down. Skip the interpreter's finalisation, during which the SDK's
    # runtime threads may still call back into Python ("Fatal Python error:
    # PyGILState_Release" on some exits).
    os._exit(0)
