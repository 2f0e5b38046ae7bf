"""Throughput: jobs/s end to end (submit → succeeded) next to bare Temporal, same dev server."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from bench.bare import BareWorkflow
from bench.harness import (
    Report,
    dev_temporal,
    ms,
    percentile,
    pg_database,
    scratch,
    service,
    submit_many,
    target,
    wait_for_pollers,
    wait_settled,
)

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
# `postgresql` as the second argument: the projection on PostgreSQL instead of SQLite.
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "sqlite"
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

        async def starter() -> None:
            for i in starts:
                await env.client.start_workflow(
                    BareWorkflow.run, f"bare {i}", id=f"{task_queue}-{i}", task_queue=task_queue
                )

        await asyncio.gather(*(starter() for _ in range(CONCURRENCY)))
        # Counted like our jobs (polled, not 2,000 long-polls, which the server refuses).
        query = f"TaskQueue = '{task_queue}' AND ExecutionStatus = 'Completed'"
        deadline = began + TIMEOUT_S
        while (await env.client.count_workflows(query)).count < JOBS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare workflows not all completed within {TIMEOUT_S} s")
            await asyncio.sleep(0.2)
        return time.monotonic() - began
    finally:
        worker.terminate()
        worker.wait(timeout=30)


@dataclass
class Run:
    seconds: float  # first POST /v1/prompts → last job settled
    accepted_s: float  # first POST → last 202
    submit_latencies: list[float]
    counts: dict[str, int]


async def promptjobs(env: WorkflowEnvironment, data_dir: Path, **overrides: object) -> Run:
    """From the first POST /v1/prompts to the last job succeeded, one worker process."""
    async with service(target(env), data_dir, **overrides) as (svc, projection, http):  # type: ignore[arg-type]
        svc.spawn("worker")
        await wait_for_pollers(env, svc.settings.temporal_task_queue)
        began = time.monotonic()
        latencies = await submit_many(http, JOBS, CONCURRENCY, {})
        accepted = time.monotonic()
        done, counts = await wait_settled(projection, JOBS, TIMEOUT_S)
        return Run(done - began, accepted - began, latencies, counts)


async def main() -> Report:
    report = Report(
        "throughput",
        {
            "jobs": f"{JOBS}, submitted with {CONCURRENCY} in flight",
            "adapter": "fake, no latency",
            "promptjobs": "POST /v1/prompts over HTTP to a `promptjobs api` process → succeeded "
            f"in the {BACKEND} projection; one `promptjobs worker` process",
            "bare Temporal": "client.start_workflow of a one-activity workflow, "
            f"{CONCURRENCY} in flight, one worker process, until every result",
            "Temporal": "one dev server on disk (WAL pragmas) for both, bare first",
        },
    )
    report.start()
    with scratch() as data_dir, contextlib.ExitStack() as stack:
        overrides: dict[str, object] = {}
        if BACKEND == "postgresql":
            overrides["database_url"] = stack.enter_context(pg_database())
        async with dev_temporal(data_dir) as env:
            bare_s = await bare_temporal(env)
            report.add("bare Temporal", f"{JOBS / bare_s:.1f} jobs/s ({bare_s:.1f} s)")
            run = await promptjobs(env, data_dir, **overrides)
            ours_s, counts = run.seconds, run.counts
            ok = counts.get("succeeded", 0)
            report.add(
                "promptjobs (succeeded/s until all settled)",
                f"{ok / ours_s:.1f} jobs/s ({ours_s:.1f} s)",
            )
            report.add(
                "promptjobs submissions (all accepted; latency while running)",
                f"{JOBS / run.accepted_s:.1f}/s ({run.accepted_s:.1f} s); "
                f"p50 {ms(percentile(run.submit_latencies, 50))}, "
                f"p99 {ms(percentile(run.submit_latencies, 99))}",
            )
            report.add(
                "promptjobs final states",
                ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                f"succeeded {JOBS}",
            )
            report.add("ratio", f"{(ok / ours_s) / (JOBS / bare_s):.2f}", "≥ 0.7")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
