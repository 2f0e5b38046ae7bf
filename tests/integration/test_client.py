"""promptjobs.client against the live API: every call, sync and async, its errors and retries,
and a stopped API (a clear error, no hang)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import httpx
import pytest
import uvicorn
from promptjobs_client import JobState
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.testing import WorkflowEnvironment

from promptjobs.client import (
    APIConnectionError,
    APIError,
    AsyncPromptJobs,
    InvalidRequest,
    OutputChunk,
    OutputReset,
    PromptJobs,
    RetryPolicy,
    WaitTimeout,
)
from tests.conftest import Stack, eventually, free_port, make_settings, running_stack

QUICK = {"fake": {"latency_ms": 100}}


def later() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=10)


async def test_the_client_sends_a_conversation_and_reads_its_tool_calls(stack: Stack) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]

    def scenario() -> None:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            messages: list[dict[str, object]] = [{"role": "user", "content": "find it"}]
            job = client.submit(messages=messages, tools=tools)
            assert job.wait(timeout=30).state is JobState.SUCCEEDED
            answer = job.response()
            [call] = answer.tool_calls or []
            assert (call.function.name, json.loads(call.function.arguments)) == (
                "lookup",
                {"q": "mock"},
            )
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "found"},
            ]
            final = client.submit(messages=messages, tools=tools)
            assert final.wait(timeout=30).state is JobState.SUCCEEDED
            assert final.response().text.endswith("found")
            assert client.prompt(final.prompt_id).messages == messages
            with pytest.raises(ValueError, match="not both"):
                client.submit("x", messages=messages)

    await asyncio.to_thread(scenario)


class Ticket(BaseModel):
    category: Literal["billing", "bug"]
    urgent: bool


async def test_the_client_asks_for_a_shape_and_parses_the_answer_into_it(stack: Stack) -> None:
    def scenario() -> None:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            missed = '{"category": "refund", "urgent": false}'
            job = client.submit(
                "Classify: my card was charged twice",
                output_schema=Ticket,
                options={"fake": {"answers": [missed]}},
            )
            assert job.wait(timeout=30).state is JobState.SUCCEEDED
            answer = job.response()
            assert answer.parse(Ticket) == Ticket(category="billing", urgent=True)
            [first, _] = job.attempts()
            assert first.outcome == "schema_mismatch" and first.errors
            assert first.errors[0].path == "/category"
            plain = client.submit("no shape", options=QUICK)
            plain.wait(timeout=30)
            with pytest.raises(ValueError, match="no output_json"):
                plain.response().parse(Ticket)

    await asyncio.to_thread(scenario)


async def test_every_sync_client_call_works_against_the_live_api(stack: Stack) -> None:
    def scenario() -> None:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            job = client.submit("hello client", options=QUICK, priority=10, max_attempts=2)
            assert job.prompt_id is not None
            done = job.wait(timeout=30)
            assert done.state is JobState.SUCCEEDED and done.priority == 10
            assert [row.state for row in job.events()] == [
                JobState.QUEUED,
                JobState.RUNNING,
                JobState.SUCCEEDED,
            ]
            response = job.response()
            assert response.job_id == job.id and response.text
            assert client.response(response.response_id) == response
            # What it streamed is the response; what it consumed, per attempt.
            output = job.output()
            assert (output.text, output.done) == (response.text, True)
            assert job.output(since=3).text == response.text[3:]
            [attempt] = job.attempts()
            assert attempt.outcome == "succeeded" and attempt.cost_usd == done.cost_usd == 0.0
            assert client.job(job.id).get() == done

            prompt = client.prompt(job.prompt_id)
            assert prompt.prompt == "hello client" and [j.job_id for j in prompt.jobs] == [job.id]

            # A retry may change what it runs with.
            again = job.retry(options={"fake": {"latency_ms": 1}}, priority=5, max_attempts=1)
            assert again.id != job.id
            rerun = again.wait(timeout=30)
            assert rerun.state is JobState.SUCCEEDED
            assert (rerun.priority, rerun.max_attempts) == (5, 1)
            assert job.get().state is JobState.SUPERSEDED
            # Checked against the API's own model before it leaves, as a submission is.
            with pytest.raises(ValueError, match="priority"):
                again.retry(priority=500)

            # A chain: the child runs once its parent's current job has succeeded, with the
            # parent's answer in place of the placeholder.
            child = client.submit("then: {{after[0]}}", after=[job.prompt_id], options=QUICK)
            assert child.wait(timeout=30).state is JobState.SUCCEEDED
            assert client.response(rerun.response_id or "").text in child.response().text
            assert client.prompt(child.prompt_id or "").after == [job.prompt_id]

            waiting = client.submit("not yet", scheduled_for=later())
            assert waiting.cancel().job_id == waiting.id
            assert waiting.wait(timeout=30).state is JobState.CANCELLED
            with pytest.raises(APIError) as no_response:
                waiting.response()
            assert no_response.value.code == "not_succeeded"

            # One idempotency key, one job; none given, a new job each time.
            first = client.submit("once", idempotency_key="order-42")
            assert client.submit("once", idempotency_key="order-42").id == first.id
            unkeyed = [client.submit("once"), client.submit("once")]
            assert unkeyed[0].id != unkeyed[1].id
            # Paging to the end means nothing changes after it: every job is settled first.
            for pending in (first, *unkeyed):
                pending.wait(timeout=30)

            pages = list(client.changes("0", limit=2))
            assert all(len(page.jobs) <= 2 for page in pages) and len(pages) > 1
            changed = {row.job_id for page in pages for row in page.jobs}
            assert {job.id, again.id, waiting.id, first.id} <= changed
            assert list(client.changes(pages[-1].next_cursor)) == []
            settled = [row.job_id for p in client.changes("0", state=JobState.CANCELLED)
                       for row in p.jobs]  # fmt: skip
            assert settled == [waiting.id]

            listed = [p.prompt_id for p in client.prompts(page_size=2)]
            assert len(listed) == len(set(listed)) >= 5 and listed[-1] == job.prompt_id

            events = client.events("0", job_id=waiting.id)
            first_event = next(events)
            assert first_event.type == "job.state_changed" and first_event.job.job_id == waiting.id
            events.close()

    await asyncio.to_thread(scenario)


STORY = "a story told a word at a time, so that a reader can watch it grow on the page"


def gathered(pieces: list[OutputChunk | OutputReset]) -> str:
    """The text a reader of `job.stream()` ends with: each piece goes on where the last
    ended, a reset starts over."""
    text = ""
    for piece in pieces:
        if isinstance(piece, OutputReset):
            text = ""
        else:
            assert piece.offset == len(text)
            text += piece.text
    return text


async def test_the_client_streams_a_jobs_text_as_it_grows(stack: Stack) -> None:
    slow = {"fake": {"latency_ms": 1500}}

    def scenario() -> None:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            job = client.submit(STORY, options=slow)
            pieces = list(job.stream(until=time.monotonic() + 30))
            assert len(pieces) > 2
            assert gathered(pieces) == job.response().text
            # Read again after the job settled: the same text, from the log.
            assert gathered(list(job.stream(until=time.monotonic() + 30))) == job.output().text

    await asyncio.to_thread(scenario)
    async with AsyncPromptJobs(stack.base_url, stack.api_key) as client:
        job = await client.submit(STORY, options=slow)
        async with asyncio.timeout(30):
            pieces = [piece async for piece in job.stream()]
        assert gathered(pieces) == (await job.response()).text


async def test_client_errors_carry_the_problem_details(stack: Stack) -> None:
    def scenario() -> None:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            with pytest.raises(APIError) as missing:
                client.get_job("job_0000")
            assert (missing.value.status, missing.value.code) == (404, "not_found")
            assert "job_0000" in missing.value.detail
            assert missing.value.problem is not None
            with pytest.raises(APIError) as invalid:
                client.submit("x", options={"provider": "nobody"})
            assert (invalid.value.status, invalid.value.code) == (422, "invalid_options")
            settled = client.submit("quick", options=QUICK)
            settled.wait(timeout=30)
            with pytest.raises(APIError) as conflict:
                settled.cancel()
            assert (conflict.value.status, conflict.value.code) == (409, "invalid_state")
            # Refused before it is sent, with the API's own validation.
            with pytest.raises(ValueError, match="priority"):
                client.submit("x", priority=500)
        with PromptJobs(stack.base_url, "pj_nobody_secret") as stranger:
            with pytest.raises(APIError) as unauthenticated:
                stranger.get_job("job_0000")
            assert unauthenticated.value.code == "invalid_api_key"

    await asyncio.to_thread(scenario)


async def test_a_wait_that_runs_out_says_so(stack: Stack) -> None:
    def scenario() -> WaitTimeout:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            job = client.submit("not yet", scheduled_for=later())
            started = time.monotonic()
            with pytest.raises(WaitTimeout) as timed_out:
                job.wait(timeout=1.5)
            assert time.monotonic() - started < 10
            job.cancel()
            return timed_out.value

    timed_out = await asyncio.to_thread(scenario)
    assert timed_out.last is not None and timed_out.last.state is JobState.QUEUED


async def test_every_async_client_call_works_against_the_live_api(stack: Stack) -> None:
    async with AsyncPromptJobs(stack.base_url, stack.api_key) as client:
        job = await client.submit("hello async", options=QUICK)
        done = await job.wait(timeout=30)
        assert done.state is JobState.SUCCEEDED
        assert [row.state async for row in job.events()][-1] is JobState.SUCCEEDED
        assert (await job.response()).job_id == job.id
        assert (await job.output()).text == (await job.response()).text
        assert [a.attempt for a in await job.attempts()] == [1]
        assert (await client.prompt(done.prompt_id)).jobs[0].job_id == job.id
        assert (await client.job(job.id).get()) == done
        again = await job.retry(priority=3)
        assert (await again.wait(timeout=30)).priority == 3
        waiting = await client.submit("not yet", scheduled_for=later())
        await waiting.cancel()
        assert (await waiting.wait(timeout=30)).state is JobState.CANCELLED
        with pytest.raises(WaitTimeout):
            await (await client.submit("later", scheduled_for=later())).wait(timeout=1)
        changed = [row.job_id async for page in client.changes("0") for row in page.jobs]
        assert {job.id, again.id, waiting.id} <= set(changed)
        listed = [p.prompt_id async for p in client.prompts(page_size=1)]
        assert job.prompt_id in listed
        assert (await client.response(done.response_id or "")).job_id == job.id
        with pytest.raises(APIError) as missing:
            await client.get_job("job_0000")
        assert missing.value.status == 404


async def test_a_stopped_api_is_a_clear_error_not_a_hang() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    quick = RetryPolicy(max_retries=2, initial_s=0.1)

    def sync_calls() -> list[str]:
        messages = []
        with PromptJobs(nowhere, "pj_any_key", retry=quick) as client:
            for call in (
                lambda: client.submit("hello"),
                lambda: client.job("job_1").wait(timeout=60),
                lambda: list(client.changes()),
            ):
                started = time.monotonic()
                with pytest.raises(APIConnectionError) as unreachable:
                    call()
                assert time.monotonic() - started < 10
                messages.append(str(unreachable.value))
        return messages

    for message in await asyncio.to_thread(sync_calls):
        assert nowhere in message and "is it running" in message
    async with AsyncPromptJobs(nowhere, "pj_any_key", retry=quick) as client:
        with pytest.raises(APIConnectionError):
            await asyncio.wait_for(client.job("job_1").wait(timeout=60), 10)


# -- 429 and 503 retried, honouring Retry-After ----------------------------------------------


class Refusing:
    """A reverse proxy in front of the live API that first refuses `refusals` requests."""

    def __init__(self, upstream: str, refusals: list[tuple[int, str]]) -> None:
        self.upstream = upstream
        self.refusals = refusals
        self.seen: list[float] = []

    async def handle(self, request: Request) -> Response:
        self.seen.append(time.monotonic())
        if self.refusals:
            status, retry_after = self.refusals.pop(0)
            return Response(
                b'{"type":"/problems/busy","title":"Busy","status":%d,"detail":"later",'
                b'"code":"busy"}' % status,
                status_code=status,
                media_type="application/problem+json",
                headers={"Retry-After": retry_after},
            )
        async with httpx.AsyncClient(base_url=self.upstream) as upstream:
            answer = await upstream.request(
                request.method,
                request.url.path,
                params=request.query_params,
                headers={k: v for k, v in request.headers.items() if k != "host"},
                content=await request.body(),
            )
        return Response(answer.content, answer.status_code, dict(answer.headers))


@asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    await eventually(lambda: asyncio.sleep(0, server.started), bool, timeout=10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_429_and_503_are_retried_after_the_servers_retry_after(stack: Stack) -> None:
    proxy = Refusing(stack.base_url, [(429, "1"), (503, "0")])
    app = Starlette(routes=[Route("/{path:path}", proxy.handle, methods=["GET", "POST"])])
    async with serve(app) as url:

        def submit() -> str:
            with PromptJobs(url, stack.api_key) as client:
                return client.submit("after a refusal").id

        job_id = await asyncio.to_thread(submit)
        assert (await stack.job(job_id))["state"] in {s.value for s in JobState}
        assert len(proxy.seen) == 3
        assert proxy.seen[1] - proxy.seen[0] >= 0.9  # Retry-After: 1 was honoured

        proxy.refusals = [(503, "120")]  # longer than the policy waits: raised at once
        async with AsyncPromptJobs(url, stack.api_key) as client:
            with pytest.raises(APIError) as busy:
                await asyncio.wait_for(client.get_job(job_id), 5)
        assert (busy.value.status, busy.value.code) == (503, "busy")


async def test_events_resume_across_dropped_streams_without_gap_or_repeat(
    dev_server: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends every stream after ~1 s (PROMPTJOBS_SSE_MAX_LIFETIME_S); the client,
    built from PROMPTJOBS_URL / PROMPTJOBS_API_KEY, resumes each with Last-Event-ID."""
    settings = make_settings(tmp_path, sse_max_lifetime_s=1.0)
    async with running_stack(settings, dev_server.client) as stack:
        monkeypatch.setenv("PROMPTJOBS_URL", stack.base_url)
        monkeypatch.setenv("PROMPTJOBS_API_KEY", stack.api_key)

        def follow() -> list[tuple[str, str, JobState]]:
            with PromptJobs() as client:
                jobs = [
                    client.submit(f"spread out {i}", options={"fake": {"latency_ms": 600 * i}})
                    for i in range(6)
                ]
                seen: list[tuple[str, str, JobState]] = []
                for event in client.events("0", until=time.monotonic() + 30):
                    seen.append((event.id, event.job.job_id, event.job.state))
                    done = {job_id for _, job_id, state in seen if state.is_terminal}
                    if done >= {job.id for job in jobs}:
                        return seen
                raise AssertionError(f"not every job settled on the stream: {seen}")

        started = time.monotonic()
        seen = await asyncio.to_thread(follow)
        print(f"{len(seen)} events over {time.monotonic() - started:.1f} s of 1 s streams")
    ids = [int(event_id) for event_id, _, _ in seen]
    assert ids == sorted(set(ids)), "an event was repeated or came out of order"
    by_job: dict[str, list[JobState]] = {}
    for _, job_id, state in seen:
        by_job.setdefault(job_id, []).append(state)
    assert all(
        states == [JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED]
        for states in by_job.values()
    ), by_job


# -- the end of a job's stream ------------------------------------------------------------


async def test_a_cancelled_jobs_stream_ends_with_its_last_text_and_usage(stack: Stack) -> None:
    """The cut-off text and the usage of a cancelled call land after the cancel; the stream
    and the events end only at the job's `job.done`, so they hold them."""
    slow = {"fake": {"latency_ms": 4000}}

    def scenario() -> None:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            job = client.submit(STORY, options=slow)
            deadline = time.monotonic() + 30
            pieces: list[OutputChunk | OutputReset] = []
            for piece in job.stream(until=deadline):
                pieces.append(piece)
                if len(pieces) == 3:
                    job.cancel()
            rows = list(job.events(until=deadline))
            waited = job.wait(timeout=30)
            final = job.get()
            assert rows[-1].state is final.state is JobState.CANCELLED
            assert gathered(pieces) == job.output().text
            assert 0 < len(gathered(pieces)) < len(STORY)
            # What wait() returns is the job's final row, its usage in.
            assert waited == final and final.output_tokens > 0
            assert [a.output_tokens for a in job.attempts()] == [final.output_tokens]

    await asyncio.to_thread(scenario)


async def test_a_stream_of_one_job_ends_after_the_job_is_over(stack: Stack) -> None:
    job = await stack.submit("brief", options=QUICK)
    await stack.settled(job["job_id"])
    params = {"since": "0", "job_id": job["job_id"]}
    async with asyncio.timeout(20):
        response = await stack.http.get("/v1/events", params=params)
    assert response.status_code == 200
    kinds = [
        line.split(": ", 1)[1] for line in response.text.splitlines() if line.startswith("event:")
    ]
    assert kinds[0] == "job.state_changed" and kinds[-1] == "job.done"
    assert kinds.count("job.done") == 1
    # A resume after its end ends at once.
    last_id = [line for line in response.text.splitlines() if line.startswith("id:")][-1]
    async with asyncio.timeout(20):
        again = await stack.http.get(
            "/v1/events",
            params={"job_id": job["job_id"]},
            headers={"Last-Event-ID": last_id.split(": ", 1)[1]},
        )
    assert "event:" not in again.text


async def test_the_async_client_drops_a_silent_stream_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that answers 200 text/event-stream and then says nothing: the async client
    counts the silence as a dead link (as the sync one does), and `wait()` goes on polling."""
    import promptjobs_client.client

    monkeypatch.setattr(promptjobs_client.client, "SILENT_STREAM_S", 0.5)
    polls: list[float] = []

    async def silent(request: Request) -> Response:
        if request.url.path == "/v1/events":

            async def nothing() -> AsyncIterator[bytes]:
                await asyncio.sleep(3600)
                yield b""

            from starlette.responses import StreamingResponse

            return StreamingResponse(nothing(), media_type="text/event-stream")
        polls.append(time.monotonic())
        state = "queued" if len(polls) < 3 else "succeeded"
        row = {
            "job_id": "job_1", "prompt_id": "pmt_1", "state": state, "priority": 50,
            "attempt": 1, "max_attempts": 3, "waiting_on": None, "options": {},
            "error_kind": None, "error_message": None, "next_attempt_at": None,
            "response_id": None, "supersedes": None, "superseded_by": None,
            "scheduled_for": None, "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z", "started_at": None,
            "attempt_started_at": None, "finished_at": None,
        }  # fmt: skip
        return Response(json.dumps(row), media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", silent)])
    quick = RetryPolicy(max_retries=1, initial_s=0.1)
    async with serve(app) as url, AsyncPromptJobs(url, "pj_any_key", retry=quick) as client:
        client.poll_interval_s = 0.1
        async with asyncio.timeout(20):
            done = await client.job("job_1").wait(timeout=15)
    assert done.state is JobState.SUCCEEDED


async def test_a_misspelt_field_is_named_with_the_one_it_meant_by_client_and_server(
    stack: Stack,
) -> None:
    answer = await stack.http.post(
        "/v1/prompts", json={"prompt": "x", "options": {"temprature": 0.2}}
    )
    assert answer.status_code == 422
    [error] = answer.json()["errors"]
    assert error["field"] == "body.options.temprature"
    assert "unknown field: remove it (did you mean `temperature`?)" in error["message"]

    def through_the_client() -> APIError:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            with pytest.raises(APIError) as refused:
                client.submit("x", options={"temprature": 0.2})
            return refused.value

    # Options are the server's to check (it knows its providers): its words reach the caller.
    said = await asyncio.to_thread(through_the_client)
    assert (said.status, said.code) == (422, "validation")
    assert "body.options.temprature: unknown field: remove it (did you mean `temperature`?)" in (
        said.detail
    )

    def checked_before_sending() -> str:
        with PromptJobs(stack.base_url, stack.api_key) as client:
            with pytest.raises(InvalidRequest) as refused:
                client.submit("x", priority=500)
            return str(refused.value)

    said_locally = await asyncio.to_thread(checked_before_sending)
    assert said_locally.startswith("fix these fields: priority: ")
    assert "pydantic" not in said_locally
