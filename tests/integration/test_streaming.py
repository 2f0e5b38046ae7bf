"""Live output on the embedded stack (the fake provider streams a word at a time): `job.output`
events in the one ordered log, resumable over SSE; a reset between attempts; the polling
fallback; usage per attempt; and a cancel that stops the call and keeps what it streamed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from temporalio.testing import WorkflowEnvironment

from activities.adapters.fake import fake_chunks, fake_output
from projections.domain.lifecycle import EventType, JobState
from tests.conftest import Stack, eventually, make_settings, running_stack

Event = tuple[int, str, dict[str, Any]]  # id, type, data

PROMPT = "tell me a story of twelve words about a queue that never lost a job"


@pytest.fixture
async def quick_retries(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose retryable failures are retried after a second, not 5 s."""
    settings = make_settings(
        tmp_path, database_url=database_url, backoff_initial_s=1.0, backoff_jitter=0.0
    )
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


async def events(
    http: httpx.AsyncClient,
    job_id: str,
    until: Callable[[list[Event]], bool],
    *,
    last_event_id: int | None = None,
    timeout: float = 30.0,
) -> list[Event]:
    """Every event of the job's stream, from the start or after `last_event_id`, until
    `until(events so far)` holds."""
    params = {"job_id": job_id}
    headers = {}
    if last_event_id is None:
        params["since"] = "0"
    else:
        headers["Last-Event-ID"] = str(last_event_id)
    got: list[Event] = []
    async with (
        asyncio.timeout(timeout),
        aconnect_sse(http, "GET", "/v1/events", params=params, headers=headers) as source,
    ):
        async for sse in source.aiter_sse():
            if not sse.event or not sse.data:
                continue
            got.append((int(sse.id), sse.event, json.loads(sse.data)))
            if until(got):
                return got
    raise AssertionError(f"the stream ended first: {got}")


def settled(got: list[Event]) -> bool:
    return any(
        kind == EventType.STATE_CHANGED and JobState(data["state"]).is_terminal
        for _, kind, data in got
    )


def outputs(got: list[Event]) -> list[dict[str, Any]]:
    return [data for _, kind, data in got if kind == EventType.OUTPUT]


async def test_output_streams_over_sse_and_resumes_without_gap_or_repeat(stack: Stack) -> None:
    job = await stack.submit(PROMPT, options={"fake": {"latency_ms": 1500}})
    # Leave after the second piece of text, then resume from the last id seen.
    first = await events(stack.http, job["job_id"], lambda got: len(outputs(got)) == 2)
    rest = await events(stack.http, job["job_id"], settled, last_event_id=first[-1][0])
    whole = first + rest
    ids = [event_id for event_id, _, _ in whole]
    assert ids == sorted(set(ids))  # in log order, none twice

    kinds = [kind for _, kind, _ in whole]
    running = next(
        i
        for i, (_, k, d) in enumerate(whole)
        if k == EventType.STATE_CHANGED and d["state"] == "running"
    )
    assert set(kinds[running + 1 : -1]) == {EventType.OUTPUT}  # text between running and the end
    pieces = outputs(whole)
    assert len(pieces) >= 3  # streamed in batches, not at the end in one
    offsets = [sum(len(p["text"]) for p in pieces[:i]) for i in range(len(pieces))]
    assert [p["offset"] for p in pieces] == offsets
    assert {p["attempt"] for p in pieces} == {1}

    row = whole[-1][2]
    assert row["state"] == "succeeded"
    response = (await stack.http.get(f"/v1/responses/{row['response_id']}")).json()
    assert "".join(p["text"] for p in pieces) == response["text"] == fake_output(PROMPT)


async def test_the_polling_fallback_returns_the_text_from_an_offset(stack: Stack) -> None:
    job = await stack.submit(PROMPT, options={"fake": {"latency_ms": 3000}})
    url = f"/v1/jobs/{job['job_id']}/output"

    async def output(since: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = (await stack.http.get(url, params={"since": since})).json()
        return body

    partial = await eventually(output, lambda o: len(o["text"]) > 0, timeout=20)
    assert partial["done"] is False and partial["attempt"] == 1
    assert fake_output(PROMPT).startswith(partial["text"])
    have = len(partial["text"])
    final = await eventually(lambda: output(have), lambda o: o["done"], timeout=20)
    assert final["offset"] == have
    assert partial["text"] + final["text"] == fake_output(PROMPT)
    assert (await stack.http.get(url, params={"since": -1})).status_code == 422
    assert (await stack.http.get("/v1/jobs/job_nope/output")).status_code == 404


async def test_a_new_attempt_after_streamed_text_resets_the_output(quick_retries: Stack) -> None:
    stack = quick_retries
    # The fake streams half its answer, then fails the first attempt with a 5xx.
    job = await stack.submit(
        PROMPT, options={"fake": {"latency_ms": 600, "fail": ["provider_5xx"]}}
    )
    got = await events(stack.http, job["job_id"], settled)
    story = [
        (kind, data.get("state"), data["attempt"])
        for _, kind, data in got
        if kind != EventType.OUTPUT
    ]
    assert story == [
        (EventType.STATE_CHANGED, "queued", 0),
        (EventType.STATE_CHANGED, "running", 1),
        (EventType.STATE_CHANGED, "queued", 1),
        (EventType.STATE_CHANGED, "running", 2),
        (EventType.OUTPUT_RESET, None, 2),
        (EventType.STATE_CHANGED, "succeeded", 2),
    ]
    # Attempt 1's half came before its failure; attempt 2's whole text after the reset.
    reset = next(i for i, (_, kind, _) in enumerate(got) if kind == EventType.OUTPUT_RESET)
    before, after = outputs(got[:reset]), outputs(got[reset:])
    half = "".join(fake_chunks(fake_output(PROMPT))[: len(fake_chunks(fake_output(PROMPT))) // 2])
    assert "".join(p["text"] for p in before) == half
    assert {p["attempt"] for p in before} == {1}
    assert after[0]["offset"] == 0 and {p["attempt"] for p in after} == {2}
    assert "".join(p["text"] for p in after) == fake_output(PROMPT)

    output = (await stack.http.get(f"/v1/jobs/{job['job_id']}/output")).json()
    assert (output["attempt"], output["text"], output["done"]) == (2, fake_output(PROMPT), True)

    # Each attempt recorded what it consumed; the row has the sums.
    row = await stack.job(job["job_id"])
    attempts = (await stack.http.get(f"/v1/jobs/{job['job_id']}/attempts")).json()["attempts"]
    assert [a["outcome"] for a in attempts] == ["provider_5xx", "succeeded"]
    assert [a["output_chars"] for a in attempts] == [len(half), len(fake_output(PROMPT))]
    assert row["input_tokens"] == sum(a["input_tokens"] for a in attempts)
    assert row["output_tokens"] == sum(a["output_tokens"] for a in attempts)
    assert row["cost_usd"] == 0.0


async def test_cancelling_a_streaming_job_stops_its_call_and_keeps_what_it_streamed(
    stack: Stack,
) -> None:
    # Twenty seconds of text, a word a second or so.
    job = await stack.submit(PROMPT, options={"fake": {"latency_ms": 20_000}})
    url = f"/v1/jobs/{job['job_id']}/output"
    await eventually(lambda: stack.http.get(url), lambda r: len(r.json()["text"]) > 0, timeout=20)
    cancelled = await stack.http.post(f"/v1/jobs/{job['job_id']}/cancel")
    assert cancelled.status_code == 202
    row = await stack.settled(job["job_id"])
    assert row["state"] == "cancelled"

    # The call stopped long before its twenty seconds; its text and usage stay.
    final = await eventually(lambda: stack.http.get(url), lambda r: r.json()["done"], timeout=20)
    kept = final.json()["text"]
    assert kept and fake_output(PROMPT).startswith(kept) and kept != fake_output(PROMPT)
    attempts = (await stack.http.get(f"/v1/jobs/{job['job_id']}/attempts")).json()["attempts"]
    [attempt] = attempts
    assert attempt["outcome"] == "cancelled"
    assert attempt["output_chars"] == len(kept)
    # The fake's own counts up to the cut (a word a token), flagged as not a tokenizer's.
    assert (attempt["input_tokens"], attempt["output_tokens"]) == (
        len(PROMPT.split()),
        len(kept.split()),
    )
    assert attempt["usage_estimated"] is True
    assert attempt["duration_ms"] < 15_000
    row = await stack.job(job["job_id"])
    assert (row["input_tokens"], row["output_tokens"]) == (
        attempt["input_tokens"],
        attempt["output_tokens"],
    )
    # A client following the job hears of the usage that came after the cancel.
    got = await events(
        stack.http,
        job["job_id"],
        lambda got: got[-1][1] == EventType.USAGE or got[-1][2].get("output_tokens"),
    )
    assert got[-1][2]["output_tokens"] == attempt["output_tokens"]
