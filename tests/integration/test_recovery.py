"""Real processes and a real dev server: a SIGKILLed worker, and Temporal down at submit."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from openai import AsyncOpenAI
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.adapters.fake import fake_output
from projections.scope import Scope
from tests.conftest import (
    MockProviderServer,
    eventually,
    free_port,
    make_settings,
    new_worker,
    provider_settings,
    running_stack,
)
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


async def test_a_worker_killed_while_a_tool_call_streams_leaves_one_whole_call(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> None:
    """The mock streams a tool call's arguments slowly; the worker is SIGKILLed mid-call. The
    next attempt's call is the answer, once: in the response, and in the response's event
    stream replayed from the start and resumed."""
    settings = provider_settings(
        tmp_path,
        mock_provider,
        heartbeat_timeout_s=2.0,
        temporal_address=temporal_address(dev_server),
    )
    properties = {name: {"type": "string"} for name in ("city", "country", "unit", "when")}
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": properties},
    }
    question = f"weather? {uuid.uuid4().hex} mock:chunk_ms=400"
    procs = tmp_path / "procs"
    mock = {
        "anthropic_base_url": mock_provider.anthropic_base_url,
        "anthropic_api_key": "mock-key",
        "provider_timeout_s": 30,
    }
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        client = AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0)
        with promptjobs_process("worker", process_env(settings, **mock), procs) as first:
            created = await client.responses.create(
                model="anthropic/claude-test", input=question, tools=[tool], background=True
            )
            await eventually(
                lambda: mock_provider.requests(question),
                lambda seen: bool(seen) and seen[0]["chunks"] >= 2,
                timeout=30,
            )
            first.kill()  # SIGKILL, with the call's arguments half sent
        with promptjobs_process("worker", process_env(settings, **mock), procs):
            done = await eventually(
                lambda: client.responses.retrieve(created.id),
                lambda r: r.status == "completed",
                timeout=60,
            )
        [call] = [item for item in done.output if item.type == "function_call"]
        assert json.loads(call.arguments) == dict.fromkeys(properties, "mock")  # type: ignore[union-attr]
        # The provider was asked twice: the first stream cut when its worker died.
        first_call, second_call = await mock_provider.requests(question)
        assert first_call["disconnected_at"] is not None and first_call["chunks"] < 5
        assert second_call["disconnected_at"] is None

        replayed = [e async for e in await client.responses.retrieve(created.id, stream=True)]
        calls = [e for e in replayed if e.type == "response.function_call_arguments.done"]
        assert [e.arguments for e in calls] == [call.arguments]  # type: ignore[union-attr]
        # Resumed after the call's first event: the rest of it, once.
        added = next(e for e in replayed if e.type == "response.output_item.added")
        resumed = [
            e
            async for e in await client.responses.retrieve(
                created.id, stream=True, starting_after=added.sequence_number
            )
        ]
        assert [e.type for e in resumed].count("response.function_call_arguments.done") == 1
        assert resumed[0].sequence_number == added.sequence_number + 1
