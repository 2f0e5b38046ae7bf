"""Many API processes and many workers on one PostgreSQL: the transition rules still hold."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from temporalio.testing import WorkflowEnvironment

from projections.domain.lifecycle import EventType, JobState, is_allowed
from projections.models import Job, JobEvent
from promptjobs.runtime import open_projection
from tests.conftest import eventually, free_port, make_settings
from tests.integration.processes import process_env, promptjobs_process
from tests.integration.sse import sse

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(400)]

JOBS = 200
WORKERS = 3
APIS = 2


def injected_failures(i: int) -> list[str]:
    """Roughly a third of the jobs fail once or twice before they succeed."""
    if i % 7 == 0:
        return ["timeout", "provider_5xx"]
    if i % 5 == 0:
        return ["provider_5xx"]
    if i % 4 == 0:
        return ["rate_limit"]
    return []


async def test_workers_and_apis_at_once_keep_every_job_legal(
    dev_server: WorkflowEnvironment, fresh_pg_database: str, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=fresh_pg_database,
        temporal_address=dev_server.client.service_client.config.target_host,
        # The production default, not the other tests' 2 s: on two busy cores the dev server
        # itself stalls for seconds under this burst, and a 2 s heartbeat timeout then takes
        # a live attempt for a crashed one (a legal `worker_crash`, but not what this tests).
        heartbeat_timeout_s=10.0,
    )
    # Retry delays as short as Temporal allows (its floor is 1 s), so the burst ends soon.
    env = process_env(settings, backoff_initial_s=0.1, sse_keepalive_s=1)
    ports = [free_port() for _ in range(APIS)]
    with ExitStack() as processes:
        # Workers first, all at once, on an empty database: each migrates at start-up.
        workers = [
            processes.enter_context(promptjobs_process("worker", env, tmp_path / "procs"))
            for _ in range(WORKERS)
        ]
        await asyncio.gather(*(w.ready() for w in workers))
        apis = [
            processes.enter_context(
                promptjobs_process(
                    "api", {**env, "PROMPTJOBS_API_PORT": str(port)}, tmp_path / "procs"
                )
            )
            for port in ports
        ]
        await asyncio.gather(*(api.ready() for api in apis))

        async with open_projection(settings, run_migrations=False) as projection:
            key = (await projection.store.keys.create("acme", "alice")).secret
            clients = [
                httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}",
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=30,
                )
                for port in ports
            ]
            try:
                async with sse(clients[0], since="0") as stream:
                    job_fails = await submit_burst(clients)
                    await eventually(
                        lambda: unsettled(projection.sessions),
                        lambda n: n == 0,
                        timeout=300,
                        interval=0.5,
                    )
                    total = await event_count(projection.sessions)
                    # Events committed by other processes reach this stream by NOTIFY.
                    await stream.until(lambda s: len(s.events) >= total)
                    streamed = [int(e["id"]) for e in stream.events]
                async with projection.sessions() as session:
                    jobs = {j.job_id: j for j in (await session.execute(select(Job))).scalars()}
                    events = list(
                        (await session.execute(select(JobEvent).order_by(JobEvent.id))).scalars()
                    )
            finally:
                for client in clients:
                    await client.aclose()

        for process in [*apis, *workers]:
            process.terminate()
        for process in [*apis, *workers]:
            assert await process.exited() == 0, process.output()

    assert len(jobs) == JOBS
    by_job: dict[str, list[JobEvent]] = defaultdict(list)
    for event in events:
        if event.type == EventType.STATE_CHANGED:  # the transitions (output is checked below)
            by_job[event.job_id].append(event)
    for job_id, fails in job_fails.items():
        job = jobs[job_id]
        story = [
            (e.id, e.state.value, e.data["attempt"], e.data["error_kind"], e.data["error_message"])
            for e in by_job[job_id]
        ]
        assert job.state is JobState.SUCCEEDED, (job_id, fails, story)
        assert [event[1:4] for event in story] == expected_events(fails), story
        assert job.attempt == len(fails) + 1
        assert job.last_event_id == story[-1][0]
        for before, after in zip(by_job[job_id], by_job[job_id][1:], strict=False):
            assert is_allowed(before.state, after.state, after.data["error_kind"])

    ids = [e.id for e in events]
    assert ids == sorted(set(ids))
    # A client following the stream from the start saw every event once, in order, no gap.
    assert streamed == ids


def expected_events(fails: list[str]) -> list[tuple[str, int, str | None]]:
    """queued, then per failed attempt running → queued (with its error), then success."""
    expected: list[tuple[str, int, str | None]] = [("queued", 0, None)]
    kind: str | None = None
    for attempt, failure in enumerate(fails, start=1):
        expected += [("running", attempt, kind), ("queued", attempt, failure)]
        kind = failure
    last = len(fails) + 1
    expected += [("running", last, kind), ("succeeded", last, None)]
    return expected


async def submit_burst(clients: list[httpx.AsyncClient]) -> dict[str, list[str]]:
    """JOBS submissions spread over the API processes, many in flight at once."""
    gate = asyncio.Semaphore(20)

    async def submit(i: int) -> tuple[str, list[str]]:
        fails = injected_failures(i)
        options: dict[str, Any] = {"fake": {"latency_ms": 50, "fail": fails, "retry_after_s": 0}}
        async with gate:
            response = await clients[i % len(clients)].post(
                "/v1/prompts", json={"prompt": f"burst {i}", "options": options}
            )
        assert response.status_code == 202, response.text
        return response.json()["job_id"], fails

    return dict(await asyncio.gather(*(submit(i) for i in range(JOBS))))


async def unsettled(sessions: Any) -> int:
    async with sessions() as session:
        stmt = (
            select(func.count())
            .select_from(Job)
            .where(Job.state.in_([JobState.QUEUED, JobState.RUNNING]))
        )
        return int((await session.execute(stmt)).scalar_one())


async def event_count(sessions: Any) -> int:
    async with sessions() as session:
        return int((await session.execute(select(func.count()).select_from(JobEvent))).scalar_one())
