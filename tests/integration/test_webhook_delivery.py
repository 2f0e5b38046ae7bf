"""Issue 49's acceptance for webhooks, on real processes: `promptjobs api` and `promptjobs
worker` in processes of their own, a receiver on loopback verifying each delivery with the
unmodified `openai` SDK. 1,000 jobs; the receiver answers 500 to the first two tries of a
tenth of the events and is down for 60 s in the middle; the worker is SIGKILLed and the API
restarted during the run. Every job's end is delivered, none is lost, every retry of an event
carries its `webhook-id`, and once the receiver is back a steady load is delivered as it comes
(how soon: bench.webhooks). A tenant's hanging endpoint: test_webhook_tenants.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from temporalio.testing import WorkflowEnvironment

from promptjobs.wiring import open_projection
from tests.conftest import eventually, free_port, make_settings
from tests.integration.processes import process_env, promptjobs_process, temporal_address

JOBS = 1000
OUTAGE_S = 60.0
# Jobs submitted a second: a steady load the one worker keeps up with on this machine.
RATE = 20.0


@dataclass
class Receiver:
    """A receiver on loopback that verifies each delivery with the `openai` SDK, answers 500
    to the first two tries of a tenth of the events (chosen by id), and can be down."""

    secret: str = ""
    port: int = field(default_factory=free_port)
    hang_s: float = 0.0
    tries: dict[str, list[bytes]] = field(default_factory=dict)
    # webhook-id -> (when it was first answered 2xx, its body)
    delivered: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    _sdk: openai.OpenAI | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

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

    @staticmethod
    def flaky(event_id: str) -> bool:
        return int(hashlib.sha256(event_id.encode()).hexdigest(), 16) % 10 == 0

    async def _take(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499)  # the sender gave up: not delivered
        if self._sdk is None:
            self._sdk = openai.OpenAI(api_key="unused", webhook_secret=self.secret)
        event = self._sdk.webhooks.unwrap(body, dict(request.headers))
        tries = self.tries.setdefault(request.headers["webhook-id"], [])
        tries.append(body)
        assert event.id == request.headers["webhook-id"]
        if self.flaky(event.id) and len(tries) <= 2:
            return web.Response(status=500, text="not yet")
        self.delivered.setdefault(event.id, (time.time(), json.loads(body)))
        return web.Response(status=200)


def finished_at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["data"]["finished_at"]).timestamp()


# 2.5 to 4 min with a 60 s outage inside: in the lane in turn, so it no longer runs on alone at
# the end of the parallel one (beside it, it takes longer: the bound leaves room for a slower
# machine than this one).
@pytest.mark.serial
@pytest.mark.timeout(600)
async def test_every_jobs_end_is_delivered_through_failures_an_outage_a_kill_and_a_restart(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'projection.db'}",
        temporal_address=temporal_address(dev_server),
        # The default: the worker started after the kill replays every workflow in flight
        # at once, and on two loaded cores a shorter timeout took its busy moments for a
        # dead worker (calls cancelled, attempts spent, jobs failed as lost).
        heartbeat_timeout_s=10.0,
    )
    port = free_port()
    env = process_env(
        settings,
        api_port=port,
        webhook_allow_ranges='["127.0.0.0/8"]',
        webhook_first_retry_s=0.5,
        # Tries at 0.5, 1.5, 4.5, 13.5 s, then every 15 s: the outage's events come within
        # 15 s of the receiver's return, without a storm of tries meanwhile (every 4 s, 750
        # events' tries starved the worker's job activities of their heartbeats).
        webhook_longest_wait_s=15,
    )
    procs = tmp_path / "procs"
    receiver = Receiver()
    async with open_projection(settings) as projection:
        admin = (await projection.store.keys.create("acme", "root", "admin")).secret
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {admin}"}
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=base, headers=headers))
        worker = stack.enter_context(promptjobs_process("worker", env, procs))
        api = stack.enter_context(promptjobs_process("api", env, procs))
        await api.ready()
        await receiver.start()
        made = await http.post("/v1/webhooks", json={"url": receiver.url})
        assert made.status_code == 201, made.text
        receiver.secret = made.json()["secret"]

        async def submit(n: int, tag: str) -> list[str]:
            async def one(i: int) -> str:
                body = {"prompt": f"{tag} {i}", "options": {"fake": {"latency_ms": 50}}}
                for _ in range(50):  # the API may be restarting: try again
                    try:
                        answer = await http.post("/v1/prompts", json=body)
                        if answer.status_code == 202:
                            return str(answer.json()["job_id"])
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.2)
                raise AssertionError(f"{tag} {i} not accepted")

            async def paced(i: int) -> str:
                await asyncio.sleep(i / RATE)
                return await one(i)

            return list(await asyncio.gather(*(paced(i) for i in range(n))))

        jobs = await submit(JOBS // 4, "first")
        worker.kill()  # SIGKILL, with jobs and deliveries in flight
        worker = stack.enter_context(promptjobs_process("worker", env, procs))
        jobs += await submit(JOBS // 4, "after the kill")
        await receiver.stop()
        down_at = time.time()
        jobs += await submit(JOBS // 4, "while the receiver is down")
        api.terminate()
        await api.exited()
        api = stack.enter_context(promptjobs_process("api", env, procs))
        await api.ready()
        await asyncio.sleep(max(0.0, OUTAGE_S - (time.time() - down_at)))
        await receiver.start()

        async def delivered(wanted: list[str], timeout: float) -> None:
            async def told() -> set[str]:
                return {event["data"]["job_id"] for _, event in receiver.delivered.values()}

            await eventually(told, lambda found: found >= set(wanted), timeout=timeout)

        # What the outage, the kill and the restart held back is delivered once the receiver
        # is back; then, caught up, a steady load.
        await delivered(jobs, timeout=120)
        last = await submit(JOBS // 4, "last")
        await delivered(last, timeout=60)

    # Each event was delivered once it was answered 2xx; every retry of it had its id and body.
    assert all(len(set(bodies)) == 1 for bodies in receiver.tries.values())
    flaky = [i for i in receiver.delivered if Receiver.flaky(i)]
    assert flaky and all(len(receiver.tries[i]) >= 3 for i in flaky)
    # The last quarter's events, made once the receiver was back and caught up, are all in
    # (how soon is bench.webhooks' figure: tests do not time).
    steady = [
        event_id
        for event_id, (_, event) in receiver.delivered.items()
        if not Receiver.flaky(event_id) and event["data"]["job_id"] in set(last)
    ]
    assert len(steady) > JOBS // 5
