"""GET /v1/events over real HTTP: transitions streamed live, resumable, filtered, kept alive."""

from __future__ import annotations

import asyncio

from tests.conftest import Stack
from tests.integration.event_stream import all_terminal, latest_by_job, read_events

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

SLOW = {"fake": {"latency_ms": 300}}


async def _cursor(stack: Stack) -> str:
    """Where the log stands now, from the polling endpoint: later events come after it."""
    listing = (await stack.http.get("/v1/jobs", params={"since": "0", "limit": 500})).json()
    return str(listing["next_cursor"])


async def test_stream_shows_each_transition_with_its_cursor(stack: Stack) -> None:
    since = await _cursor(stack)
    job = await stack.submit("stream me", options=SLOW)

    events = await read_events(stack.http, all_terminal({job["job_id"]}), params={"since": since})

    assert [e.state for e in events] == ["queued", "running", "succeeded"]
    assert [e.job_id for e in events] == [job["job_id"]] * 3
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 3 and ids[0] > int(since)


async def test_stream_and_polling_return_the_same_rows(stack: Stack) -> None:
    since = await _cursor(stack)
    jobs = {(await stack.submit(f"same rows {i}", options=SLOW))["job_id"] for i in range(3)}

    streamed = latest_by_job(
        await read_events(stack.http, all_terminal(jobs), params={"since": since})
    )
    polled = (await stack.http.get("/v1/jobs", params={"since": since})).json()["jobs"]

    assert {row["job_id"]: row for row in polled} == streamed
    for job_id in jobs:
        assert await stack.job(job_id) == streamed[job_id]


async def test_without_a_cursor_the_stream_starts_from_now(stack: Stack) -> None:
    old = await stack.submit("before the stream")
    await stack.settled(old["job_id"])
    new: dict[str, str] = {}

    async def submit_once_connected() -> None:
        new.update(await stack.submit("after connecting"))

    events = await read_events(
        stack.http,
        lambda events: any(e.state == "succeeded" for e in events),
        on_connected=submit_once_connected,
    )

    assert {e.job_id for e in events} == {new["job_id"]}
    assert events[0].state == "queued"


async def test_reconnect_with_last_event_id_resumes_without_gap_or_duplicate(stack: Stack) -> None:
    since = await _cursor(stack)
    first_batch = {
        (await stack.submit(f"before drop {i}", options=SLOW))["job_id"] for i in range(4)
    }

    # Read part of the stream, then drop the connection mid-stream.
    before_drop = await read_events(
        stack.http, lambda events: len(events) >= 5, params={"since": since}
    )
    # While disconnected, more jobs are submitted and keep changing.
    second_batch = {
        (await stack.submit(f"after drop {i}", options=SLOW))["job_id"] for i in range(3)
    }
    everything = first_batch | second_batch

    # Reconnect as a browser's EventSource does: the same URL, plus Last-Event-ID, which wins.
    after_drop = await read_events(
        stack.http,
        lambda events: all_terminal(everything)(before_drop + events),
        params={"since": since},
        headers={"Last-Event-ID": str(before_drop[-1].id)},
    )

    resumed = before_drop + after_drop
    ids = [e.id for e in resumed]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    replay = await read_events(
        stack.http, lambda events: events[-1].id >= ids[-1], params={"since": since}
    )
    assert [(e.id, e.job) for e in replay] == [(e.id, e.job) for e in resumed], "a gap"
    assert {e.job_id for e in resumed} == everything


async def test_filters_by_job_and_by_prompt(stack: Stack) -> None:
    since = await _cursor(stack)
    one = await stack.submit("filtered one")
    other = await stack.submit("filtered other")
    await stack.settled(one["job_id"])
    retry = (await stack.http.post(f"/v1/jobs/{one['job_id']}/retry")).json()
    await stack.settled(other["job_id"])
    await stack.settled(retry["job_id"])

    by_job = await read_events(
        stack.http,
        lambda events: events[-1].state == "superseded",
        params={"since": since, "job_id": one["job_id"]},
    )
    assert {e.job_id for e in by_job} == {one["job_id"]}
    assert [e.state for e in by_job] == ["queued", "running", "succeeded", "superseded"]

    by_prompt = await read_events(
        stack.http,
        all_terminal({one["job_id"], retry["job_id"]}),
        params={"since": since, "prompt_id": one["prompt_id"]},
    )
    assert {e.job_id for e in by_prompt} == {one["job_id"], retry["job_id"]}


async def test_idle_stream_gets_keepalive_comments(stack: Stack) -> None:
    # The stack's keep-alive is 1 s; a client reading raw lines sees `: ping` comments.
    async with (
        asyncio.timeout(20),
        stack.http.stream("GET", "/v1/events", headers={"Accept": "text/event-stream"}) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith(": ping"):
                break


async def test_bad_cursors_are_rejected_with_a_problem(stack: Stack) -> None:
    for request in (
        {"headers": {"Last-Event-ID": "abc"}},
        {"params": {"since": "-1"}},
        {"params": {"since": "1e5"}},
    ):
        response = await stack.http.get("/v1/events", **request)  # type: ignore[arg-type]
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert "not a cursor" in response.json()["detail"]
