"""Graceful shutdown with real processes: SIGTERM to a worker or to the API loses nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from projections.domain.lifecycle import EventType
from projections.scope import Scope
from promptjobs.runtime import open_projection
from tests.conftest import Stack, eventually, free_port, make_settings, running_stack
from tests.integration.processes import process_env, promptjobs_process
from tests.integration.sse import sse

pytestmark = pytest.mark.postgres


@pytest.fixture
async def api_only(
    dev_server: WorkflowEnvironment, fresh_pg_database: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """The API and its dispatcher in this process; the workers are `promptjobs worker`s."""
    settings = make_settings(
        tmp_path,
        database_url=fresh_pg_database,
        temporal_address=dev_server.client.service_client.config.target_host,
    )
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        yield stack


async def running(stack: Stack, job_id: str) -> dict[str, Any]:
    return await eventually(lambda: stack.job(job_id), lambda j: j["state"] == "running")


async def event_log(stack: Stack, job_id: str) -> list[tuple[str, int, str | None]]:
    """(state, attempt, error_kind) of each of the job's events, as SSE clients receive them."""
    events = await stack.projection.store.events_since(
        Scope("acme", "alice"), 0, 100, job_id=job_id
    )
    return [
        (e.state.value, e.data["attempt"], e.data["error_kind"])
        for e in events
        if e.type == EventType.STATE_CHANGED
    ]


async def test_sigterm_lets_the_running_call_finish(api_only: Stack, tmp_path: Path) -> None:
    env = process_env(api_only.settings, shutdown_grace_s=20)
    with promptjobs_process("worker", env, tmp_path / "procs") as first:
        await first.ready()
        job_id = (await api_only.submit(options={"fake": {"latency_ms": 1500}}))["job_id"]
        await running(api_only, job_id)

        first.terminate()
        assert await first.exited() == 0, first.output()

        # The call finished within the grace period and its result is in the workflow's
        # history; persisting it is the workflow's next step, on whichever worker polls next.
        with promptjobs_process("worker", env, tmp_path / "procs") as second:
            await second.ready()
            job = await api_only.settled(job_id)
    assert job["state"] == "succeeded"
    assert job["attempt"] == 1
    assert await event_log(api_only, job_id) == [
        ("queued", 0, None),
        ("running", 1, None),
        ("succeeded", 1, None),
    ]


async def test_a_call_cut_off_by_the_grace_period_runs_again_elsewhere(
    api_only: Stack, tmp_path: Path
) -> None:
    env = process_env(api_only.settings, shutdown_grace_s=0.5)
    with promptjobs_process("worker", env, tmp_path / "procs") as first:
        await first.ready()
        job_id = (await api_only.submit(options={"fake": {"latency_ms": 4000}}))["job_id"]
        await running(api_only, job_id)

        first.terminate()
        assert await first.exited() == 0, first.output()
    # Re-queued at once, with the reason, while no worker is left: visibly waiting, not lost.
    waiting = await api_only.job(job_id)
    assert (waiting["state"], waiting["error_kind"]) == ("queued", "worker_crash")
    assert "shut down mid-call" in waiting["error_message"]

    with promptjobs_process("worker", env, tmp_path / "procs") as second:
        await second.ready()
        job = await api_only.settled(job_id)
    assert job["state"] == "succeeded"
    assert job["attempt"] == 2
    assert await event_log(api_only, job_id) == [
        ("queued", 0, None),
        ("running", 1, None),
        ("queued", 1, "worker_crash"),
        ("running", 2, "worker_crash"),
        ("succeeded", 2, None),
    ]


async def test_sigterm_to_the_api_ends_sse_streams_and_exits(
    dev_server: WorkflowEnvironment, fresh_pg_database: str, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=fresh_pg_database,
        temporal_address=dev_server.client.service_client.config.target_host,
        api_port=free_port(),
        # Longer than the test waits: a stream left open would hold the exit this long.
        shutdown_grace_s=60,
    )
    env = process_env(settings, api_port=settings.api_port, sse_keepalive_s=1)
    with promptjobs_process("api", env, tmp_path / "procs") as api:
        await api.ready()
        async with open_projection(settings) as projection:
            key = (await projection.store.keys.create("acme", "alice")).secret
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{settings.api_port}",
            headers={"Authorization": f"Bearer {key}"},
        ) as http:
            accepted = await http.post("/v1/prompts", json={"prompt": "before the end"})
            assert accepted.status_code == 202
            async with sse(http, since="0") as stream:
                await stream.until(lambda s: len(s.events) == 1)
                api.terminate()
                # The server ends the stream: the reader finishes without a protocol error.
                await stream.until(lambda s: s.ended, timeout=10)
                assert stream.reader is not None and stream.reader.exception() is None
        assert await api.exited(timeout=10) == 0, api.output()
