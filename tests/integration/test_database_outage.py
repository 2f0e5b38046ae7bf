"""The projection database goes away while jobs run: nothing is lost, nothing is decided by it.

Real processes (`promptjobs api` + `promptjobs worker`) on a PostgreSQL server of the test's
own, stopped as a crash would (`pg_ctl stop -m immediate`) and started again; and the SQLite
analogue, the database file locked by another writer for longer than the busy timeout.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
from temporalio.testing import WorkflowEnvironment

from promptjobs.runtime import open_projection
from promptjobs.settings import Settings
from tests.conftest import eventually, free_port, make_settings
from tests.integration.own_postgres import own_postgres
from tests.integration.processes import (
    Process,
    process_env,
    promptjobs_process,
    temporal_address,
)
from tests.integration.sse import sse

JOBS = 10


async def api_key(settings: Settings) -> str:
    async with open_projection(settings) as projection:
        return (await projection.store.keys.create("acme", "alice")).secret


async def all_jobs(http: httpx.AsyncClient, ids: list[str]) -> list[dict[str, Any]]:
    jobs = []
    for job_id in ids:
        response = await http.get(f"/v1/jobs/{job_id}")
        if response.status_code != 200:
            return []  # the database is not back yet
        jobs.append(response.json())
    return jobs


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert int(response.headers["retry-after"]) > 0
    assert response.json()["code"] == "unavailable"


def still_up(*processes: Process) -> None:
    for process in processes:
        assert process.popen.poll() is None, f"{process.name} exited:\n{process.output()}"


async def test_postgres_outage_mid_jobs_every_job_still_succeeds_without_spending_attempts(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    with own_postgres(tmp_path) as postgres:
        settings = make_settings(
            tmp_path,
            database_url=postgres.url,
            temporal_address=temporal_address(dev_server),
            api_port=free_port(),
        )
        procs = tmp_path / "procs"
        env = process_env(settings, api_port=settings.api_port)
        with (
            promptjobs_process("api", env, procs) as api,
            promptjobs_process("worker", process_env(settings), procs) as worker,
        ):
            await api.ready()
            await worker.ready()
            key = await api_key(settings)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{settings.api_port}",
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            ) as http:
                ids = await submit_running(http, "outage", latency_ms=3000)

                postgres.stop("immediate")
                assert_unavailable(await http.post("/v1/prompts", json={"prompt": "during"}))
                assert_unavailable(await http.get(f"/v1/jobs/{ids[0]}"))
                assert_unavailable(await http.get("/v1/jobs"))
                assert (await http.get("/readyz")).status_code == 503
                # The calls end while the database is down: their results wait to be written.
                await eventually(
                    lambda: asyncio.sleep(0, worker.output()),
                    lambda out: "settle success" in out,
                    timeout=30,
                )
                still_up(api, worker)
                postgres.start()

                jobs = await eventually(
                    lambda: all_jobs(http, ids),
                    lambda jobs: len(jobs) == JOBS and all(j["state"] == "succeeded" for j in jobs),
                    timeout=60,
                )
                assert [j["attempt"] for j in jobs] == [1] * JOBS
                assert (await http.get("/readyz")).status_code == 200

                async with sse(http, since="0") as stream:
                    after = await http.post("/v1/prompts", json={"prompt": "after"})
                    assert after.status_code == 202, after.text
                    job_id = after.json()["job_id"]
                    await stream.until(lambda s: "succeeded" in s.states_of(job_id), timeout=30)
                still_up(api, worker)


async def test_sqlite_locked_past_busy_timeout_jobs_wait_and_succeed(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    database = tmp_path / "projection.db"
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{database}",
        temporal_address=temporal_address(dev_server),
        api_port=free_port(),
        sqlite_busy_timeout_s=1.0,
    )
    procs = tmp_path / "procs"
    env = process_env(settings, api_port=settings.api_port, sqlite_busy_timeout_s=1.0)
    worker_env = process_env(settings, sqlite_busy_timeout_s=1.0)
    # One after the other: two processes migrating a new SQLite file at once is issue 22's
    # item 12, not this test's subject.
    with promptjobs_process("api", env, procs) as api:
        await api.ready()
        with promptjobs_process("worker", worker_env, procs) as worker:
            await worker.ready()
            await _ride_out_sqlite_lock(settings, database, api, worker)


async def submit_running(http: httpx.AsyncClient, prefix: str, *, latency_ms: int) -> list[str]:
    """JOBS slow jobs submitted, once every one of them is running: their ids."""
    ids = []
    for n in range(JOBS):
        body = {"prompt": f"{prefix} {n}", "options": {"fake": {"latency_ms": latency_ms}}}
        accepted = await http.post("/v1/prompts", json=body)
        assert accepted.status_code == 202, accepted.text
        ids.append(accepted.json()["job_id"])
    await eventually(
        lambda: all_jobs(http, ids),
        lambda jobs: len(jobs) == JOBS and all(j["state"] == "running" for j in jobs),
        timeout=30,
    )
    return ids


async def _ride_out_sqlite_lock(
    settings: Settings, database: Path, api: Process, worker: Process
) -> None:
    key = await api_key(settings)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{settings.api_port}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    ) as http:
        ids = await submit_running(http, "locked", latency_ms=1500)
        # Another writer holds the write lock for longer than the busy timeout.
        holder = sqlite3.connect(database, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert_unavailable(await http.post("/v1/prompts", json={"prompt": "during"}))
            await eventually(
                lambda: asyncio.sleep(0, worker.output()),
                lambda out: "settle success" in out,
                timeout=30,
            )
            still_up(api, worker)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        jobs = await eventually(
            lambda: all_jobs(http, ids),
            lambda jobs: len(jobs) == JOBS and all(j["state"] == "succeeded" for j in jobs),
            timeout=60,
        )
        assert [j["attempt"] for j in jobs] == [1] * JOBS
        after = await http.post("/v1/prompts", json={"prompt": "after"})
        assert after.status_code == 202, after.text
        still_up(api, worker)
