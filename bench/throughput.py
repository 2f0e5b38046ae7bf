"""Throughput: jobs/s end to end (submit → succeeded) next to bare Temporal, same dev server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from bench.bare import BareWorkflow
from bench.harness import (
    Report,
    dev_temporal,
    scratch,
    service,
    submit_many,
    target,
    wait_for_count,
    wait_for_pollers,
)

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
CONCURRENCY = 32
TIMEOUT_S = 600


async def bare_temporal(env: WorkflowEnvironment) -> float:
    """Seconds from the first start_workflow to the last result, one bare worker process."""
    task_queue = f"bare-{uuid.uuid4().hex[:8]}"
    # Popen returns at once; the bench starts this one process before it measures.
    worker = subprocess.Popen([sys.executable, "-m", "bench.bare", target(env), task_queue])  # noqa: ASYNC220
    try:
        await wait_for_pollers(env, task_queue)
        began = time.monotonic()
        starts = iter(range(JOBS))
        handles = []

        async def starter() -> None:
            for i in starts:
                handles.append(
                    await env.client.start_workflow(
                        BareWorkflow.run, f"bare {i}", id=f"bare-{task_queue}-{i}",
                        task_queue=task_queue,
                    )
                )  # fmt: skip

        await asyncio.gather(*(starter() for _ in range(CONCURRENCY)))
        await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), TIMEOUT_S)
        return time.monotonic() - began
    finally:
        worker.terminate()
        worker.wait(timeout=30)


async def promptjobs(env: WorkflowEnvironment, data_dir: Path) -> float:
    """Seconds from the first POST /v1/prompts to the last job succeeded, one worker process."""
    async with service(target(env), data_dir) as (svc, projection, http):  # type: ignore[arg-type]
        svc.spawn("worker")
        await wait_for_pollers(env, svc.settings.temporal_task_queue)
        began = time.monotonic()
        await submit_many(http, JOBS, CONCURRENCY, {})
        done = await wait_for_count(projection, "succeeded", JOBS, TIMEOUT_S, interval=0.2)
        return done - began


async def main() -> Report:
    report = Report(
        "throughput",
        {
            "jobs": f"{JOBS}, submitted with {CONCURRENCY} in flight",
            "adapter": "fake, no latency",
            "promptjobs": "POST /v1/prompts over HTTP to a `promptjobs api` process → succeeded "
            "in the SQLite projection; one `promptjobs worker` process",
            "bare Temporal": "client.start_workflow of a one-activity workflow, "
            f"{CONCURRENCY} in flight, one worker process, until every result",
            "Temporal": "one dev server on disk (WAL pragmas) for both, bare first",
        },
    )
    report.start()
    with scratch() as data_dir:
        async with dev_temporal(data_dir) as env:
            bare_s = await bare_temporal(env)
            report.add("bare Temporal", f"{JOBS / bare_s:.1f} jobs/s ({bare_s:.1f} s)")
            ours_s = await promptjobs(env, data_dir)
            report.add("promptjobs", f"{JOBS / ours_s:.1f} jobs/s ({ours_s:.1f} s)")
            report.add("ratio", f"{bare_s / ours_s:.2f}", "≥ 0.7")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
