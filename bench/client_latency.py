"""Submit latency through the project's own client: `AsyncPromptJobs.submit` p50/p99 at
concurrency 1 and 32, as a backend that submits with it sees them, 2 s fake jobs running.

    .venv/bin/python -m bench.client_latency [COUNT] [postgresql]

Split processes as `bench.submit_latency` runs them; the client as users construct it (its
defaults: pool, timeouts, retries). Whichever `promptjobs_client` is first on the path is
measured, so an older client can be compared in one sitting:
`PYTHONPATH=<a clone>/clients/python .venv/bin/python -m bench.client_latency`."""

from __future__ import annotations

import asyncio

import promptjobs_client
from promptjobs_client import AsyncPromptJobs

from bench.harness import (
    CpuMeter,
    Report,
    args,
    bench_stack,
    ms,
    percentile,
    service,
    target,
    timed,
    wait_for_pollers,
)

ARGS = args(default_count=960)
REQUESTS = {1: 300, 32: ARGS.count}
OPTIONS = {"fake": {"latency_ms": 2000}}


async def main() -> Report:
    report = Report(
        "submit latency through promptjobs_client",
        {
            "client": f"AsyncPromptJobs from {promptjobs_client.__file__}, its defaults",
            "requests": f"{REQUESTS} (concurrency: count), each phase after a warm pool",
            "adapter": "fake, latency_ms=2000",
            "stack": ARGS.stack,
        },
    )
    report.start()
    async with (
        bench_stack(ARGS) as (data_dir, env, overrides),
        service(target(env), data_dir, **overrides) as (svc, _, http),
    ):
        svc.start_worker()
        await wait_for_pollers(env, svc.settings.temporal_task_queue)
        key = http.headers["Authorization"].removeprefix("Bearer ")
        async with AsyncPromptJobs(svc.base_url, key) as client:
            for concurrency, n in REQUESTS.items():
                meter = CpuMeter()

                async def send(prompt: str) -> None:
                    await client.submit(prompt, options=OPTIONS)

                latencies = await timed(send, n, concurrency, warm=True)
                report.add(f"c={concurrency} CPU", meter.per(n, "submit"))
                report.add(f"c={concurrency} p50", ms(percentile(latencies, 50)))
                goal = "p99 < 25 ms" if concurrency == 1 else "p99 < 100 ms"
                report.add(f"c={concurrency} p99", ms(percentile(latencies, 99)), goal)
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
