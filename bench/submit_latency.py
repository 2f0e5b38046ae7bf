"""Submit latency: POST /v1/prompts p50/p99 at concurrency 1 and 32, adapter at 2 s."""

from __future__ import annotations

import asyncio
import sys
import time

from sqlalchemy import func, select

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
)
from projections.models import Job
from promptjobs.runtime import open_projection
from promptjobs.settings import Settings

WARMUP = 20
# [COUNT (requests at c=32, for a profile's length)] [postgresql] [embedded] [noworker] [httpx]
ARGS = args(default_count=960)
REQUESTS = {1: 300, 32: ARGS.count}
BODY: dict[str, object] = {"options": {"fake": {"latency_ms": 2000}}}


async def main() -> Report:
    report = Report(
        "submit latency",
        {
            "requests": f"{REQUESTS} (concurrency: count), after {WARMUP} warm-up "
            "requests and, each phase, as many at once as it has in flight (a warm pool)",
            "adapter": "fake, latency_ms=2000",
            "stack": f"{ARGS.stack}, dev server on disk (WAL)"
            + ("; no worker (the jobs stay queued)" if ARGS.no_worker else ""),
            "client": f"{ARGS.client} in the bench process, keep-alive",
        },
    )
    report.start()
    async with (
        bench_stack(ARGS) as (data_dir, env, overrides),
        service(target(env), data_dir, embedded=ARGS.embedded, **overrides) as (svc, _, http),
    ):
        if not ARGS.no_worker:
            svc.start_worker()
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
        await submit_many(http, WARMUP, 1, BODY)
        for concurrency, n in REQUESTS.items():
            meter = CpuMeter()
            latencies = await submit_many(http, n, concurrency, BODY, client=ARGS.client, warm=True)
            report.add(f"c={concurrency} CPU", meter.per(n, "submit"))
            goal = "p99 < 25 ms (seed: < 100 ms)" if concurrency == 1 else "seed: p99 < 100 ms"
            report.add(f"c={concurrency} p50", ms(percentile(latencies, 50)))
            report.add(f"c={concurrency} p99", ms(percentile(latencies, 99)), goal)
            if concurrency > 1:
                behind = await undispatched(svc.settings)
                caught_up = await starts_caught_up(svc.settings)
                report.add(
                    f"c={concurrency} starts",
                    f"{behind} jobs' workflows not yet started at the last answer; "
                    f"all started {caught_up:.1f} s later",
                )
    return report


async def undispatched(settings: Settings) -> int:
    async with open_projection(settings, run_migrations=False, streams=False) as projection:
        async with projection.sessions() as session:
            return int(
                await session.scalar(
                    select(func.count()).select_from(Job).where(Job.dispatched_at.is_(None))
                )
                or 0
            )


async def starts_caught_up(settings: Settings) -> float:
    """Seconds until every accepted job's workflow start is recorded (the dispatcher's
    backlog after a burst)."""
    began = time.monotonic()
    while True:
        if not await undispatched(settings):
            return time.monotonic() - began
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main()).print()
    sys.exit(0)
