"""Where a c=32 submit's time goes: the engine's part and ours, measured apart in one run.

1. bare Temporal: `client.start_workflow` of bench/bare.py's workflow from this process,
   a bare worker running them (what the dispatcher's start costs the engine);
2. promptjobs' API with Temporal unreachable: HTTP, validation, key check and the projection
   write, no workflow start competing for the CPU (the dispatcher keeps retrying; the jobs
   stay queued);
3. promptjobs' API with Temporal and a worker, as `bench.submit_latency` runs it.

Each at concurrency 1 and 32 with the fake adapter at 2 s. Compare the rows with each other,
within this run only.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from bench.bare import BareWorkflow
from bench.harness import (
    Report,
    dev_temporal,
    free_port,
    ms,
    percentile,
    scratch,
    service,
    submit_many,
    target,
    wait_for_pollers,
)

REQUESTS = {1: 200, 32: 960}
WARMUP = 20
BODY: dict[str, object] = {"options": {"fake": {"latency_ms": 2000}}}


async def concurrently(
    n: int, concurrency: int, call: Callable[[int], Awaitable[object]]
) -> list[float]:
    latencies: list[float] = []
    pending = iter(range(n))

    async def caller() -> None:
        for i in pending:
            started = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return latencies


def add(report: Report, part: str, concurrency: int, latencies: list[float]) -> None:
    figure = f"{ms(percentile(latencies, 50))} / {ms(percentile(latencies, 99))}"
    report.add(f"{part} c={concurrency} p50 / p99", figure)


async def main() -> Report:
    report = Report(
        "submit parts",
        {"requests": f"{REQUESTS} (concurrency: count)", "adapter": "fake, latency_ms=2000"},
    )
    report.start()
    with scratch() as data_dir:
        async with dev_temporal(data_dir) as env:
            task_queue = f"bare-{uuid.uuid4().hex[:8]}"
            bare = subprocess.Popen([sys.executable, "-m", "bench.bare", target(env), task_queue])  # noqa: ASYNC220
            try:
                await wait_for_pollers(env, task_queue)

                async def start(i: int) -> None:
                    await env.client.start_workflow(
                        BareWorkflow.run,
                        args=[f"bare {i}", 0.0],
                        id=f"{task_queue}-{i}",
                        task_queue=task_queue,
                    )

                await concurrently(WARMUP, 1, lambda i: start(-1 - i))
                offset = 0
                for concurrency, n in REQUESTS.items():
                    latencies = await concurrently(n, concurrency, lambda i, o=offset: start(o + i))
                    offset += n
                    add(report, "bare start_workflow", concurrency, latencies)
            finally:
                bare.terminate()
                bare.wait(timeout=30)

        for part in ("no-temporal", "full"):
            (data_dir / part).mkdir()
        nowhere = f"127.0.0.1:{free_port()}"
        async with service(nowhere, data_dir / "no-temporal") as (_, _, http):
            await submit_many(http, WARMUP, 1, BODY)
            for concurrency, n in REQUESTS.items():
                add(report, "API, Temporal unreachable", concurrency,
                    await submit_many(http, n, concurrency, BODY))  # fmt: skip

        async with (
            dev_temporal(data_dir / "full") as env,
            service(target(env), data_dir / "full") as (svc, _, http),
        ):
            svc.spawn("worker")
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
            await submit_many(http, WARMUP, 1, BODY)
            for concurrency, n in REQUESTS.items():
                add(report, "API + Temporal + worker", concurrency,
                    await submit_many(http, n, concurrency, BODY))  # fmt: skip
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
    sys.exit(0)
