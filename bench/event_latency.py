"""Event latency: a transition's commit → its arrival at an SSE client, and at a 2 s poller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from datetime import UTC, datetime

import httpx

from bench.harness import (
    Report,
    dev_temporal,
    ms,
    percentile,
    scratch,
    service,
    target,
    wait_for_count,
    wait_for_pollers,
)

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
RATE_PER_S = 10
POLL_S = 2.0


def parse_iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def sse_client(http: httpx.AsyncClient, latencies: list[float], stop: asyncio.Event) -> None:
    """Each event's arrival minus the row's updated_at (the transition's commit time)."""
    async with http.stream("GET", "/v1/events", timeout=None) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                row = json.loads(line.removeprefix("data:").strip())
                arrived = datetime.now(UTC)
                latencies.append((arrived - parse_iso(row["updated_at"])).total_seconds())
            if stop.is_set():
                return


async def poller(http: httpx.AsyncClient, latencies: list[float], stop: asyncio.Event) -> None:
    """GET /v1/jobs?since= every 2 s; each changed row's arrival minus its updated_at."""
    cursor = "0"
    while not stop.is_set():
        while True:
            body = (await http.get("/v1/jobs", params={"since": cursor, "limit": 500})).json()
            arrived = datetime.now(UTC)
            for row in body["jobs"]:
                latencies.append((arrived - parse_iso(row["updated_at"])).total_seconds())
            cursor = body["next_cursor"]
            if len(body["jobs"]) < 500:
                break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)


async def main() -> Report:
    report = Report(
        "event latency",
        {
            "jobs": f"{JOBS} submitted at {RATE_PER_S}/s, each: queued → running → succeeded",
            "adapter": "fake, no latency",
            "SSE client": "one GET /v1/events stream (sse_poll_interval_s default 0.1)",
            "poller": f"GET /v1/jobs?since= every {POLL_S} s (sees a job's latest row)",
            "commit time": "the row's updated_at (set in the transaction, just before COMMIT); "
            "arrival: the bench's clock, same machine",
        },
    )
    report.start()
    with scratch() as data_dir:
        async with (
            dev_temporal(data_dir) as env,
            service(target(env), data_dir) as (svc, proj, http),
        ):
            svc.spawn("worker")
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
            sse: list[float] = []
            polled: list[float] = []
            stop = asyncio.Event()
            readers = [
                asyncio.create_task(sse_client(http, sse, stop)),
                asyncio.create_task(poller(http, polled, stop)),
            ]
            await asyncio.sleep(0.5)  # the SSE stream starts "from now"
            for i in range(JOBS):
                began = time.monotonic()
                response = await http.post("/v1/prompts", json={"prompt": f"event {i}"})
                assert response.status_code == 202, response.text
                await asyncio.sleep(max(0, 1 / RATE_PER_S - (time.monotonic() - began)))
            await wait_for_count(proj, "succeeded", JOBS, 120)
            await asyncio.sleep(POLL_S + 0.5)  # the poller's last round
            stop.set()
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            for name, values, goal in (
                ("SSE", sse, "p99 < 50 ms (seed: 200 ms)"),
                (f"{POLL_S:.0f} s poller", polled, ""),
            ):
                report.add(f"{name} events", str(len(values)))
                report.add(f"{name} p50", ms(percentile(values, 50)))
                report.add(f"{name} p99", ms(percentile(values, 99)), goal)
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
