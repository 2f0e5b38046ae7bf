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
    """The mock streams a tool call's arguments slowly; they are in the job's output as they
    come; the worker is SIGKILLed mid-call. The next attempt's call is the answer, once: in
    the response, and in the response's event stream replayed from the start and resumed
    (the cut attempt's half a call closed as incomplete)."""
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
            job_id = created.model_extra["promptjobs"]["job_id"]  # type: ignore[index]
            # The call streams into the job's output (the polling read of its event log).
            half = await eventually(
                lambda: stack.http.get(f"/v1/jobs/{job_id}/output"),
                lambda r: (
                    bool(r.json()["tool_calls"])
                    and r.json()["tool_calls"][0]["function"]["arguments"] not in ("", "{}")
                ),
                timeout=30,
            )
            [streaming] = half.json()["tool_calls"]
            assert streaming["function"]["name"] == "get_weather"
            first.kill()  # SIGKILL, with the call's arguments half sent
        with promptjobs_process("worker", process_env(settings, **mock), procs):
            done = await eventually(
                lambda: client.responses.retrieve(created.id),
                lambda r: r.status == "completed",
                timeout=60,
            )
        [call] = [item for item in done.output if item.type == "function_call"]
        # The lost attempt counts: the answer is the job's second attempt.
        assert (await stack.job(job_id))["attempt"] == 2
        assert json.loads(call.arguments) == dict.fromkeys(properties, "mock")  # type: ignore[union-attr]
        # The provider was asked twice: the first stream cut when its worker died.
        first_call, second_call = await mock_provider.requests(question)
        assert first_call["disconnected_at"] is not None and first_call["chunks"] < 5
        assert second_call["disconnected_at"] is None

        replayed = [e async for e in await client.responses.retrieve(created.id, stream=True)]
        ended = [
            e.item  # type: ignore[union-attr]
            for e in replayed
            if e.type == "response.output_item.done" and e.item.type == "function_call"  # type: ignore[union-attr]
        ]
        # The first attempt's half a call, closed as cut, then the answer's call, whole.
        assert [i.status for i in ended] == ["incomplete", "completed"]
        assert ended[-1].arguments == call.arguments and ended[-1].id == call.id
        assert call.arguments.startswith(ended[0].arguments.removesuffix("{}"))
        deltas = [e for e in replayed if e.type == "response.function_call_arguments.delta"]
        assert len(deltas) > 2  # the arguments came in pieces, as they streamed
        # Resumed after the answer's call opened: the rest of it, once.
        added = [e for e in replayed if e.type == "response.output_item.added"][-1]
        resumed = [
            e
            async for e in await client.responses.retrieve(
                created.id, stream=True, starting_after=added.sequence_number
            )
        ]
        assert [e.type for e in resumed].count("response.function_call_arguments.done") == 1
        assert resumed[0].sequence_number == added.sequence_number + 1
        pieces = [e.delta for e in resumed if e.type == "response.function_call_arguments.delta"]  # type: ignore[union-attr]
        assert "".join(pieces) == call.arguments
