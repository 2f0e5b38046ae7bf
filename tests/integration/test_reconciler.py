"""The reconciler repairs rows whose workflow is gone or closed without settling them."""

from __future__ import annotations

from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import build_dispatcher
from tests.conftest import Stack, eventually

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")


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


async def test_job_whose_workflow_is_gone_is_started_again(stack: Stack) -> None:
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
