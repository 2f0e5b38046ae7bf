"""Event streams while the service is busy: commit → SSE client with 200 streams open while
jobs stream their answers and a client submits.

    .venv/bin/python -m bench.stream_load [postgresql] [embedded]

Split processes (an API, a worker) as `bench.submit_latency` runs them; 200 `GET /v1/events`
streams from a client process of their own (bench/stream_fanout.py's raw-socket client, so
its CPU stays small). Then 100 submits, one every 0.1 s, of 2 s fake jobs that stream their
answers, beside a background load of the same jobs at 10 a second. Every transition each
stream receives is timed from its commit (the row's `updated_at`, set in the transaction) to
its arrival. The submits' own latency is reported too."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from bench.harness import (
    CpuMeter,
    Report,
    args,
    bench_stack,
    ms,
    percentile,
    service,
    target,
    wait_for_pollers,
)
from bench.stream_fanout import start_client

STREAMS = 200
SUBMITS = 100
SUBMIT_EVERY_S = 0.1
BACKGROUND_PER_S = 10
ARGS = args(default_count=STREAMS)
BODY: dict[str, object] = {"options": {"fake": {"latency_ms": 2000}}}


async def main() -> Report:
    report = Report(
        "streams under load",
        {
            "streams": f"{ARGS.count} on GET /v1/events (one org), a client process of their own",
            "load": f"{SUBMITS} submits every {SUBMIT_EVERY_S} s, beside {BACKGROUND_PER_S}/s "
            "in the background; fake jobs of 2 s that stream their answers",
            "stack": ARGS.stack,
        },
    )
    report.start()
    async with (
        bench_stack(ARGS) as (data_dir, env, overrides),
        service(
            target(env),
            data_dir,
            embedded=ARGS.embedded,
            extra_env={"PROMPTJOBS_SSE_MAX_STREAMS_PER_KEY": str(ARGS.count)},
            **overrides,
        ) as (svc, _, http),
    ):
        if not ARGS.embedded:
            svc.start_worker()
        await wait_for_pollers(env, svc.settings.temporal_task_queue)
        key = http.headers["Authorization"].removeprefix("Bearer ")
        window_s = SUBMITS * SUBMIT_EVERY_S + 6.0  # the last jobs' 2 s and their settling
        reader = start_client(
            {
                "port": int(svc.base_url.rsplit(":", 1)[1]),
                "keys": [key],
                "streams": ARGS.count,
                "expect": 1_000_000,  # until the window ends
                "timeout_s": window_s,
            }
        )
        assert reader.stdout is not None
        ready = await asyncio.to_thread(reader.stdout.readline)
        assert ready.strip() == b"ready", ready
        background = asyncio.create_task(load(http, window_s))
        meter = CpuMeter()
        submits = []
        for i in range(SUBMITS):
            started = time.monotonic()
            answer = await http.post("/v1/prompts", json={**BODY, "prompt": f"measured {i}"})
            submits.append(time.monotonic() - started)
            assert answer.status_code == 202, answer.text
            await asyncio.sleep(max(0.0, SUBMIT_EVERY_S - submits[-1]))
        out = await asyncio.to_thread(reader.stdout.readline)
        latencies = json.loads(out)["latencies"]
        # "python": the streams' client process.
        report.add("CPU", meter.per(max(1, len(latencies) // 1000), "1,000 events delivered"))
        await background
        reader.wait(timeout=30)
        report.add("events received", f"{len(latencies)} (every transition, every stream)")
        report.add("commit → event p50", ms(percentile(latencies, 50)))
        report.add("commit → event p99", ms(percentile(latencies, 99)), "p99 < 100 ms")
        report.add("submit p50", ms(percentile(submits, 50)))
        report.add("submit p90", ms(percentile(submits, 90)))
        report.add("submit p99", ms(percentile(submits, 99)), "p99 < 25 ms")
    return report


async def load(http: httpx.AsyncClient, seconds: float) -> None:
    """Jobs submitted at BACKGROUND_PER_S for `seconds`, so the worker streams answers
    throughout."""
    ends = time.monotonic() + seconds
    i = 0
    while time.monotonic() < ends:
        await http.post("/v1/prompts", json={**BODY, "prompt": f"background {i}"})
        i += 1
        await asyncio.sleep(1 / BACKGROUND_PER_S)


if __name__ == "__main__":
    asyncio.run(main()).print()
    sys.exit(0)
