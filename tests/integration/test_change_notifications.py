"""On PostgreSQL, SSE streams wake on LISTEN/NOTIFY when another process commits an event."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from projections.notifications import libpq_url
from tests.conftest import Stack, eventually, make_settings, running_stack
from tests.integration.processes import process_env, promptjobs_process, temporal_address
from tests.integration.sse import Stream, sse

pytestmark = pytest.mark.postgres

# Far longer than any wait below: an event that arrives was delivered by a NOTIFY wake-up,
# not by the stream's poll.
POLL_S = 30.0
PROMPT = {"options": {"fake": {"latency_ms": 500}}}


async def settles_on_stream(stack: Stack, stream: Stream) -> None:
    # The succeeded event is committed by the worker process at least 500 ms after the
    # submission woke this stream: only a NOTIFY can bring it here within the deadline.
    job_id = (await stack.submit("notify me", **PROMPT))["job_id"]
    await stream.until(lambda s: "succeeded" in s.states_of(job_id), timeout=POLL_S / 2)
    assert stream.states_of(job_id) == ["queued", "running", "succeeded"]


async def listener_pids(url: str) -> list[int]:
    """Backends of the API's LISTEN connection on this test's database that listen already
    (a backend is there from its connect; its LISTEN comes a moment later)."""
    database = url.rsplit("/", 1)[1]
    async with await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'promptjobs-listen'"
            " AND datname = %s AND query LIKE 'LISTEN%%'",
            (database,),
        )
        return [row[0] for row in await cursor.fetchall()]


async def test_sse_wakes_on_a_commit_by_a_worker_process(
    dev_server: WorkflowEnvironment, fresh_pg_database: str, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=fresh_pg_database,
        temporal_address=temporal_address(dev_server),
        sse_poll_interval_s=POLL_S,
    )
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", process_env(stack.settings), tmp_path / "procs") as w:
            await w.ready()
            async with sse(stack.http) as stream:
                await settles_on_stream(stack, stream)


async def test_listener_reconnects_after_its_connection_drops(
    dev_server: WorkflowEnvironment, fresh_pg_database: str, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=fresh_pg_database,
        temporal_address=temporal_address(dev_server),
        sse_poll_interval_s=POLL_S,
    )
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", process_env(stack.settings), tmp_path / "procs") as w:
            await w.ready()
            [first] = await eventually(
                lambda: listener_pids(fresh_pg_database), lambda pids: len(pids) == 1
            )
            async with await psycopg.AsyncConnection.connect(
                libpq_url(fresh_pg_database), autocommit=True
            ) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s)", (first,))
            await eventually(
                lambda: listener_pids(fresh_pg_database),
                lambda pids: len(pids) == 1 and first not in pids,
            )
            async with sse(stack.http) as stream:
                await settles_on_stream(stack, stream)
