"""Webhook deliveries: from a job's end to its receiver's 2xx, under a steady load, and how a
receiver that was down catches up.

    .venv/bin/python -m bench.webhooks [quick]

`promptjobs api` and one `promptjobs worker` (SQLite), a receiver on loopback that verifies
each delivery with the `openai` SDK (as docs/webhooks.md shows) and answers 200. 500 fake jobs
(50 ms each) are submitted at 20 a second while the receiver is up: figures are each job's
`finished_at` to its event's arrival, p50 and p99 (goal p99 < 1 s). Then the receiver goes
down for OUTAGE_S (60 s; `quick`: 15 s) while 200 more jobs end: figures are how long after
it comes back every event is in, and whether any is lost (goal 0)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import datetime
from typing import Any

import openai
from aiohttp import web

from bench.harness import (
    Args,
    Report,
    bench_stack,
    free_port,
    ms,
    percentile,
    service,
    target,
    wait_for_pollers,
)

QUICK = "quick" in sys.argv[1:]
STEADY_JOBS = 500
OUTAGE_JOBS = 200
PER_S = 20.0
OUTAGE_S = 15.0 if QUICK else 60.0


class Receiver:
    def __init__(self) -> None:
        self.port = free_port()
        self.secret = ""
        self.arrived: dict[str, tuple[float, dict[str, Any]]] = {}
        self._sdk: openai.OpenAI | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hooks", self._take)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _take(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self._sdk is None:
            self._sdk = openai.OpenAI(api_key="unused", webhook_secret=self.secret)
        event = self._sdk.webhooks.unwrap(body, dict(request.headers))
        self.arrived.setdefault(event.id, (time.time(), json.loads(body)["data"]))
        return web.Response(status=200)

    def jobs(self) -> dict[str, float]:
        """Each job told of: when its event first arrived."""
        return {data["job_id"]: at for at, data in self.arrived.values()}


async def main() -> Report:
    report = Report(
        "webhooks",
        {
            "load": f"{STEADY_JOBS} fake jobs (50 ms) at {PER_S:g} a second, receiver up; then "
            f"{OUTAGE_JOBS} while it is down {OUTAGE_S:g} s",
            "stack": "promptjobs api + 1 worker, SQLite; a receiver on loopback verifying with "
            "the openai SDK",
        },
    )
    report.start()
    receiver = Receiver()
    await receiver.start()
    env = {
        "PROMPTJOBS_WEBHOOK_ALLOW_RANGES": '["127.0.0.0/8"]',
        "PROMPTJOBS_WEBHOOK_FIRST_RETRY_S": "1",
        "PROMPTJOBS_WEBHOOK_LONGEST_WAIT_S": "10",
    }
    try:
        async with (
            bench_stack(Args(0, "sqlite", False)) as (data_dir, temporal, overrides),
            service(target(temporal), data_dir, extra_env=env, **overrides) as (
                svc,
                projection,
                http,
            ),
        ):
            svc.spawn("worker")
            await wait_for_pollers(temporal, svc.settings.temporal_task_queue)
            admin = (await projection.store.keys.create("acme", "root", "admin")).secret
            made = await http.post(
                "/v1/webhooks",
                json={"url": f"http://127.0.0.1:{receiver.port}/hooks"},
                headers={"Authorization": f"Bearer {admin}"},
            )
            made.raise_for_status()
            receiver.secret = made.json()["secret"]

            async def submit(n: int, tag: str) -> list[str]:
                began = time.monotonic()
                ids = []
                for i in range(n):
                    body = {"prompt": f"{tag} {i}", "options": {"fake": {"latency_ms": 50}}}
                    answer = await http.post("/v1/prompts", json=body)
                    ids.append(answer.json()["job_id"])
                    await asyncio.sleep(max(0.0, began + (i + 1) / PER_S - time.monotonic()))
                return ids

            async def all_in(ids: list[str], timeout: float) -> float:
                """When the last of `ids` was told of (or the timeout passed)."""
                for _ in range(int(timeout / 0.2)):
                    if set(ids) <= receiver.jobs().keys():
                        break
                    await asyncio.sleep(0.2)
                told = receiver.jobs()
                return max(told.get(i, float("inf")) for i in ids)

            steady = await submit(STEADY_JOBS, "steady")
            await all_in(steady, 60)
            ended = {}
            for job_id in steady:
                job = (await http.get(f"/v1/jobs/{job_id}")).json()
                ended[job_id] = datetime.fromisoformat(job["finished_at"]).timestamp()
            told = receiver.jobs()
            waits = [told[j] - ended[j] for j in steady if j in told]
            report.add(
                "job's end → its event at the receiver, receiver up",
                f"p50 {ms(percentile(waits, 50))}, p99 {ms(percentile(waits, 99))} "
                f"({len(waits)} of {len(steady)})",
                "p99 < 1 s",
            )
            await receiver.stop()
            down = time.time()
            during = await submit(OUTAGE_JOBS, "during")
            await asyncio.sleep(max(0.0, down + OUTAGE_S - time.time()))
            await receiver.start()
            back = time.time()
            last = await all_in(during, 120)
            missing = len(set(during) - receiver.jobs().keys())
            report.add(
                f"after a {OUTAGE_S:g} s outage: every event in",
                f"{last - back:.1f} s after the receiver came back; {missing} missing",
                "0 missing",
            )
    finally:
        await receiver.stop()
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
