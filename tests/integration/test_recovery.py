"""Real processes and a real dev server: a SIGKILLed worker, and Temporal down at submit."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.adapters.fake import fake_output
from projections.scope import Scope
from tests.conftest import eventually, free_port, make_settings, new_worker, running_stack
from tests.integration.processes import (
    process_env,
    promptjobs_process,
    temporal_address,
    temporal_on_disk,
)

ALICE = Scope("acme", "alice", "member")


async def test_sigkilled_worker_mid_call_job_finishes_on_another_worker(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path, heartbeat_timeout_s=2.0, temporal_address=temporal_address(dev_server)
    )
    procs = tmp_path / "procs"
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", process_env(settings), procs) as first:
            accepted = await stack.submit("survive", options={"fake": {"latency_ms": 4000}})
            running = await eventually(
                lambda: stack.job(accepted["job_id"]),
                lambda j: j["state"] == "running",
                timeout=30,
            )
            assert running["attempt"] == 1
            first.kill()  # SIGKILL, mid-call
        with promptjobs_process("worker", process_env(settings), procs):
            job = await stack.settled(accepted["job_id"], timeout=60)

        assert (job["state"], job["attempt"]) == ("succeeded", 2)
        events = await stack.projection.store.job_events(ALICE, accepted["job_id"])
        assert [e.state.value for e in events] == [
            "queued", "running", "queued", "running", "succeeded",
        ]  # fmt: skip
        crashed = events[2].data
        assert crashed["error_kind"] == "worker_crash"
        assert str(first.pid) in (crashed["error_message"] or "")
        answer = (await stack.http.get(f"/v1/responses/{job['response_id']}")).json()
        assert answer["text"] == fake_output("survive")


async def test_submission_while_temporal_is_down_runs_once_it_is_back(tmp_path: Path) -> None:
    port = free_port()
    database = tmp_path / "temporal.db"
    address = f"127.0.0.1:{port}"

    async def start_temporal() -> WorkflowEnvironment:
        return await temporal_on_disk(port, database)

    # Create the namespace's data once, then take Temporal away.
    await (await start_temporal()).shutdown()
    settings = make_settings(tmp_path, temporal_address=address)
    client = await Client.connect(address, lazy=True)
    async with running_stack(settings, client, run_worker=False) as stack:
        accepted = await stack.submit("patience")
        assert accepted["state"] == "queued"
        job = await stack.job(accepted["job_id"])
        assert job["state"] == "queued"

        env = await start_temporal()
        try:
            async with new_worker(settings, env.client, stack.projection):
                job = await stack.settled(accepted["job_id"], timeout=60)
        finally:
            await env.shutdown()
    assert job["state"] == "succeeded"
