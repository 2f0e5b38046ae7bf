"""Submit latency: POST /v1/prompts p50/p99 at concurrency 1 and 32, adapter at 2 s."""

from __future__ import annotations

import asyncio
import sys

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

REQUESTS = {1: 300, 32: 960}
WARMUP = 20
# [postgresql] [embedded]
ARGS = args(default_count=0)
BODY: dict[str, object] = {"options": {"fake": {"latency_ms": 2000}}}


async def main() -> Report:
    report = Report(
        "submit latency",
        {
            "requests": f"{REQUESTS} (concurrency: count), after {WARMUP} warm-up requests",
            "adapter": "fake, latency_ms=2000",
            "stack": f"{ARGS.stack}, dev server on disk (WAL)"
            + ("; no worker (the jobs stay queued)" if ARGS.no_worker else ""),
            "client": ("httpx" if ARGS.httpx_client else "aiohttp")
            + " in the bench process, keep-alive",
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
            latencies = await submit_many(http, n, concurrency, BODY, with_httpx=ARGS.httpx_client)
            report.add(f"c={concurrency} CPU", meter.per(n, "submit"))
            goal = "p99 < 25 ms (seed: < 100 ms)" if concurrency == 1 else "seed: p99 < 100 ms"
            report.add(f"c={concurrency} p50", ms(percentile(latencies, 50)))
            report.add(f"c={concurrency} p99", ms(percentile(latencies, 99)), goal)
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
    sys.exit(0)
