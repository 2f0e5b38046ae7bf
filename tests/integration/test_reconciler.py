"""The reconciler repairs rows whose workflow is gone or closed without settling them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import build_dispatcher
from tests.conftest import Stack, eventually, make_settings, running_stack

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")


@pytest.fixture
async def quiet_stack(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose dispatcher scans once at start and then stays out of the way, so that a
    row the test writes is not started by its scan meanwhile."""
    settings = make_settings(
        tmp_path,
        database_url=database_url,
        dispatcher_interval_s=3600.0,
        reconciler_interval_s=3600.0,
    )
    async with running_stack(settings, dev_server.client) as stack:
        # Its one scan, of an empty store, is over long before this (seconds when loaded).
        await asyncio.sleep(2.0)
        yield stack


async def test_job_whose_workflow_was_terminated_is_settled(stack: Stack) -> None:
    accepted = await stack.submit("long", options={"fake": {"latency_ms": 30000}})
    await eventually(lambda: stack.job(accepted["job_id"]), lambda j: j["state"] == "running")
    # An operator terminates the workflow in the Web UI: no activity gets to settle the row.
    await stack.client.get_workflow_handle(accepted["job_id"]).terminate("operator")
    dispatcher = build_dispatcher(
        stack.settings.model_copy(update={"reconciler_grace_s": 0}), stack.client, stack.projection
    )
    assert await dispatcher.reconciler.reconcile_once() == 1
    job = await stack.job(accepted["job_id"])
    assert (job["state"], job["error_kind"]) == ("failed", "unknown")
    assert "terminated" in job["error_message"]


async def test_job_whose_workflow_is_gone_is_started_again(quiet_stack: Stack) -> None:
    stack = quiet_stack
    # A row marked dispatched whose workflow the server does not know (a lost dev server).
    accepted = await stack.projection.store.submit(
        ALICE, Submission(text="lost", priority=50, max_attempts=3, options={})
    )
    await stack.projection.store.mark_dispatched(accepted.job.job_id)
    dispatcher = build_dispatcher(
        stack.settings.model_copy(update={"reconciler_grace_s": 0}), stack.client, stack.projection
    )
    assert await dispatcher.reconciler.reconcile_once() >= 1
    job = await stack.settled(accepted.job.job_id)
    assert job["state"] == "succeeded"
