"""Responses streamed as OpenAI's events through the unmodified `openai` SDK: at create, by
id from any sequence number, across a restarted API process and a cut attempt."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from temporalio.testing import WorkflowEnvironment

from activities.adapters.fake import fake_chunks, fake_output
from tests.conftest import Stack, free_port, make_settings, running_stack
from tests.integration.processes import process_env, promptjobs_process

PROMPT = "one two three four five six seven eight nine ten eleven twelve"


def sdk(base_url: str, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


def fake(latency_ms: int, **more: Any) -> dict[str, Any]:
    return {"promptjobs": {"options": {"fake": {"latency_ms": latency_ms, **more}}}}


def assert_well_formed(events: list[Any], first: int = 0) -> None:
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(first, first + len(events))), numbers


async def test_stream_at_create_gives_openais_events_in_order(stack: Stack) -> None:
    client = sdk(stack.base_url, stack.api_key)
    stream = await client.responses.create(
        model="fake/any", input=PROMPT, stream=True, extra_body=fake(500)
    )
    events = [event async for event in stream]
    assert_well_formed(events)
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == fake_output(PROMPT)
    assert len(deltas) > 1  # it streamed, not one piece at the end
    completed = events[-1].response
    assert completed.status == "completed"
    assert completed.output_text == fake_output(PROMPT)
    assert completed.usage.output_tokens == len(fake_chunks(fake_output(PROMPT)))


async def test_the_sdks_stream_helper_resumes_a_background_response(stack: Stack) -> None:
    client = sdk(stack.base_url, stack.api_key)
    created = await client.responses.create(
        model="fake/any", input=PROMPT, background=True, extra_body=fake(300)
    )
    async with client.responses.stream(response_id=created.id, starting_after=2) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert events[0].sequence_number == 3
    assert final.output_text == fake_output(PROMPT)
    # Any time later, the same events again, from 0: the log, not a buffer.
    again = [e async for e in await client.responses.retrieve(created.id, stream=True)]
    assert_well_formed(again)
    assert [_key(e) for e in again[3:]] == [_key(e) for e in events]


def _key(event: Any) -> tuple[str, int, str | None]:
    return event.type, event.sequence_number, getattr(event, "delta", None)


async def test_a_cut_attempts_text_is_closed_not_glued_to_the_next(stack: Stack) -> None:
    client = sdk(stack.base_url, stack.api_key)
    stream = await client.responses.create(
        model="fake/any", input=PROMPT, stream=True, extra_body=fake(600, fail=["worker_crash"])
    )
    events = [event async for event in stream]
    assert_well_formed(events)
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.output_index for e in added] == [0, 1]
    assert [e.item.status for e in done] == ["incomplete", "completed"]
    cut, answer = (
        "".join(e.delta for e in events if e.type.endswith(".delta") and e.output_index == i)
        for i in (0, 1)
    )
    assert fake_output(PROMPT).startswith(cut) and cut != fake_output(PROMPT)
    assert answer == fake_output(PROMPT)
    final = events[-1].response
    assert final.output_text == fake_output(PROMPT)
    assert [item.id for item in final.output] == [done[1].item.id]


async def test_resume_from_a_sequence_number_on_a_restarted_api(
    stack: Stack, tmp_path: Path
) -> None:
    """The first API process is killed mid-stream; another, which never saw the response,
    carries on from the last sequence number the client had."""
    procs = tmp_path / "procs"
    ports = [free_port(), free_port()]
    env = [process_env(stack.settings, api_port=port) for port in ports]
    with promptjobs_process("api", env[0], procs) as first:
        await first.ready()
        client = sdk(f"http://127.0.0.1:{ports[0]}", stack.api_key)
        created = await client.responses.create(
            model="fake/any", input=PROMPT, background=True, extra_body=fake(3000)
        )
        seen: list[Any] = []
        async for event in await client.responses.retrieve(created.id, stream=True):
            seen.append(event)
            if sum(e.type == "response.output_text.delta" for e in seen) == 3:
                break
        first.kill()
    assert_well_formed(seen)
    with promptjobs_process("api", env[1], procs) as second:
        await second.ready()
        client = sdk(f"http://127.0.0.1:{ports[1]}", stack.api_key)
        rest = [
            event
            async for event in await client.responses.retrieve(
                created.id, stream=True, starting_after=seen[-1].sequence_number
            )
        ]
        second.terminate()
        await asyncio.wait_for(asyncio.to_thread(second.popen.wait), 30)
    assert_well_formed(rest, first=seen[-1].sequence_number + 1)
    text = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
    assert text == fake_output(PROMPT)
    assert rest[-1].type == "response.completed"


async def test_cancel_mid_stream_ends_the_stream_cancelled(stack: Stack) -> None:
    client = sdk(stack.base_url, stack.api_key)
    stream = await client.responses.create(
        model="fake/any", input=PROMPT, stream=True, extra_body=fake(30_000)
    )
    events: list[Any] = []
    asked = False
    async for event in stream:
        events.append(event)
        if event.type == "response.output_text.delta" and not asked:
            asked = True
            cancelled = await client.responses.cancel(events[0].response.id)
            assert cancelled.status == "cancelled"
    assert_well_formed(events)
    last = events[-1]
    assert last.type == "response.failed"
    assert last.response.status == "cancelled"
    # The cut text's item is closed, not left open.
    assert events[-2].type == "response.output_item.done"
    assert events[-2].item.status == "incomplete"


async def test_a_stream_refused_at_the_keys_limit_makes_no_job(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # The place is taken before the job is made: the SDK retries the 429 (without an
    # Idempotency-Key), and no retry may submit the request again.
    settings = make_settings(tmp_path, sse_max_streams_per_key=1)
    async with running_stack(settings, dev_server.client) as stack:
        open_stream = await sdk(stack.base_url, stack.api_key).responses.create(
            model="fake/any", input=PROMPT, stream=True, extra_body=fake(5000)
        )
        first = await anext(aiter(open_stream))
        assert first.type == "response.created"
        retrying = AsyncOpenAI(
            base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=1
        )
        with pytest.raises(openai.RateLimitError) as refused:
            await retrying.responses.create(
                model="fake/any", input="refused", stream=True, extra_body=fake(10)
            )
        assert "open streams" in str(refused.value)
        jobs = (await stack.http.get("/v1/jobs")).json()["jobs"]
        await open_stream.close()
    assert len(jobs) == 1, "only the open stream's job was made"
