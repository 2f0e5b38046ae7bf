"""How long a committed transition takes to reach a connected SSE client (a figure, not a test).

    .venv/bin/python bench/sse_latency.py [--events 200] [--database-url URL]

Runs the API on a free port over SQLite (or the URL given), connects one SSE client with
httpx-sse, then commits job submissions two ways and times commit -> event received:

- same process: through the API process's own projection, which wakes streams at once;
- other process: through a second engine with its own change feed, as a separate worker
  process would, so the API only learns of the commit from its event-log watcher
  (PROMPTJOBS_SSE_POLL_INTERVAL_S).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse
from temporalio.client import Client

from projections.scope import Scope
from projections.writes import Submission
from promptjobs.launch import serve
from promptjobs.runtime import Projection, open_projection
from promptjobs.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(
    writer: Projection, client: httpx.AsyncClient, scope: Scope, count: int
) -> list[float]:
    since = await writer.store.latest_event_id()
    committed: dict[str, float] = {}
    received: dict[str, float] = {}
    connected = asyncio.Event()

    async def listen() -> None:
        params = {"since": str(since)}
        async with aconnect_sse(client, "GET", "/v1/events", params=params) as source:
            async for sse in source.aiter_sse():
                if sse.event != "job.state_changed":
                    connected.set()
                    continue
                received[json.loads(sse.data)["job_id"]] = time.perf_counter()
                if len(received) == count:
                    return

    listener = asyncio.create_task(listen())
    await connected.wait()
    for i in range(count):
        accepted = await writer.store.submit(
            scope, Submission(text=f"bench {i}", priority=50, max_attempts=1, options={})
        )
        committed[accepted.job.job_id] = time.perf_counter()
        await asyncio.sleep(0.005 + (i % 7) * 0.003)  # spread commits over poll phases
    await asyncio.wait_for(listener, 60)
    # An event can arrive before `submit` returns to the writer; that counts as 0.
    return [max(0.0, received[job] - at) for job, at in committed.items()]


def report(name: str, latencies: list[float]) -> None:
    ms = sorted(x * 1000 for x in latencies)
    q = statistics.quantiles(ms, n=100)
    print(
        f"{name:14s} n={len(ms)}  p50 {q[49]:6.1f} ms  p95 {q[94]:6.1f} ms  "
        f"p99 {q[98]:6.1f} ms  max {ms[-1]:6.1f} ms"
    )


async def main(events: int, database_url: str | None) -> None:
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            database_url=database_url or f"sqlite:///{Path(tmp) / 'bench.db'}",
            api_port=free_port(),
            dispatcher_interval_s=3600,
            reconciler_interval_s=3600,
        )
        # Nothing listens there: the bench measures the projection and the stream, not Temporal.
        temporal = await Client.connect(f"127.0.0.1:{free_port()}", lazy=True)
        async with open_projection(settings) as api_side, open_projection(settings) as other:
            stop, ready = asyncio.Event(), asyncio.Event()
            server = asyncio.create_task(
                serve(
                    settings,
                    temporal,
                    api_side,
                    stop,
                    run_worker=False,
                    run_api=True,
                    on_ready=ready.set,
                )
            )
            await ready.wait()
            issued = await api_side.store.keys.create("bench", "bench", "admin")
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{settings.api_port}",
                headers={"Authorization": f"Bearer {issued.secret}"},
                timeout=30,
            ) as client:
                print(
                    f"{settings.projection_url.split(':')[0]}, "
                    f"poll interval {settings.sse_poll_interval_s * 1000:.0f} ms"
                )
                report("same process", await measure(api_side, client, issued.scope, events))
                report("other process", await measure(other, client, issued.scope, events))
            stop.set()
            await server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    asyncio.run(main(args.events, args.database_url))
