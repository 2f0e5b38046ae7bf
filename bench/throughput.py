"""Throughput: jobs/s end to end (submit → succeeded) next to bare Temporal, same dev server."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from bench.bare import OUR_SHAPE, bare_temporal
from bench.harness import (
    CpuMeter,
    Report,
    args,
    bench_stack,
    ms,
    percentile,
    service,
    submit_many,
    target,
    wait_for_pollers,
    wait_settled,
)

# [JOBS] [postgresql] [embedded] [pinned]
ARGS = args(default_count=2000)
JOBS = ARGS.count
CONCURRENCY = 32
TIMEOUT_S = 600


@dataclass
class Run:
    seconds: float  # first POST /v1/prompts → last job settled
    accepted_s: float  # first POST → last 202
    submit_latencies: list[float]
    counts: dict[str, int]
    cpu: str  # whose CPU, per job


async def promptjobs(env: WorkflowEnvironment, data_dir: Path, **overrides: object) -> Run:
    """From the first POST /v1/prompts to the last job succeeded, one worker."""
    async with service(target(env), data_dir, embedded=ARGS.embedded, **overrides) as (
        svc,
        projection,
        http,
    ):
        svc.start_worker()
        await wait_for_pollers(env, svc.settings.temporal_task_queue)
        meter = CpuMeter()
        began = time.monotonic()
        latencies = await submit_many(http, JOBS, CONCURRENCY, {})
        accepted = time.monotonic()
        done, counts = await wait_settled(projection, JOBS, TIMEOUT_S)
        return Run(done - began, accepted - began, latencies, counts, meter.per(JOBS))


async def main() -> Report:
    report = Report(
        "throughput",
        {
            "jobs": f"{JOBS}, submitted with {CONCURRENCY} in flight",
            "adapter": "fake, no latency",
            "promptjobs": "POST /v1/prompts over HTTP → succeeded in the projection; " + ARGS.stack,
            "bare Temporal": "client.start_workflow of a one-activity workflow, "
            f"{CONCURRENCY} in flight, one worker process, until every result; then the same "
            "with our workflow's shape (bench/bare.py)",
            "Temporal": "one dev server on disk (WAL pragmas) for both, bare first",
        },
    )
    report.start()
    async with bench_stack(ARGS) as (data_dir, env, overrides):
        bare_s, bare_cpu = await bare_temporal(env, JOBS, CONCURRENCY)
        report.add("bare Temporal", f"{JOBS / bare_s:.1f} jobs/s ({bare_s:.1f} s)")
        report.add("bare Temporal, CPU", bare_cpu)
        shaped_s, shaped_cpu = await bare_temporal(env, JOBS, CONCURRENCY, shape=OUR_SHAPE)
        report.add(
            "bare Temporal, our workflow's shape",
            f"{JOBS / shaped_s:.1f} jobs/s ({shaped_s:.1f} s)",
        )
        report.add("bare Temporal, our workflow's shape, CPU", shaped_cpu)
        run = await promptjobs(env, data_dir, **overrides)
        ours_s, counts = run.seconds, run.counts
        ok = counts.get("succeeded", 0)
        report.add(
            "promptjobs (succeeded/s until all settled)",
            f"{ok / ours_s:.1f} jobs/s ({ours_s:.1f} s)",
        )
        report.add("promptjobs, CPU", run.cpu)
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
        report.add("ratio", f"{(ok / ours_s) / (JOBS / bare_s):.2f}", "≥ 0.8")
        report.add("ratio to our workflow's shape", f"{(ok / ours_s) / (JOBS / shaped_s):.2f}")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
