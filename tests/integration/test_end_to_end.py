"""The whole service over real HTTP: dev server, worker, API, SQLite and PostgreSQL."""

from __future__ import annotations

from activities.adapters.fake import fake_output
from projections.domain.lifecycle import EventType
from tests.conftest import Stack


async def test_submitted_prompt_goes_queued_running_succeeded(stack: Stack) -> None:
    response = await stack.http.post(
        "/v1/prompts", json={"prompt": "Write a haiku", "options": {"fake": {"latency_ms": 200}}}
    )
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["state"] == "queued"
    assert response.headers["location"] == f"/v1/jobs/{accepted['job_id']}"

    job = await stack.settled(accepted["job_id"])
    assert job["state"] == "succeeded"
    assert job["attempt"] == 1
    assert job["started_at"] and job["finished_at"]

    answer = (await stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert answer["text"] == fake_output("Write a haiku")
    assert answer["job_id"] == accepted["job_id"]

    listing = (await stack.http.get("/v1/jobs", params={"since": "0"})).json()
    events = [j for j in listing["jobs"] if j["job_id"] == accepted["job_id"]]
    assert events[0]["state"] == "succeeded"

    events = await stack.projection.store.events_since(_scope(), 0, 100, job_id=accepted["job_id"])
    states = [e.state.value for e in events if e.type == EventType.STATE_CHANGED]
    assert states == ["queued", "running", "succeeded"]
    # The answer streamed in pieces, between running and succeeded, and adds up to it.
    kinds = [e.type for e in events]
    pieces = [e.data for e in events if e.type == EventType.OUTPUT]
    assert kinds.index(EventType.OUTPUT) > kinds.index(EventType.STATE_CHANGED, 1)
    assert "".join(p["text"] for p in pieces) == answer["text"]
    assert [p["offset"] for p in pieces] == [
        sum(len(q["text"]) for q in pieces[:i]) for i in range(len(pieces))
    ]
    output = (await stack.http.get(f"/v1/jobs/{accepted['job_id']}/output")).json()
    assert output == {
        "job_id": accepted["job_id"],
        "attempt": 1,
        "offset": 0,
        "text": answer["text"],
        "tool_calls": None,
        "done": True,
    }

    # What the attempt consumed: the fake counts words as tokens, and costs nothing.
    assert (job["input_tokens"], job["output_tokens"]) == (3, len(answer["text"].split()))
    assert job["cost_usd"] == 0.0
    assert answer["usage"]["usage_estimated"] is True
    attempts = (await stack.http.get(f"/v1/jobs/{accepted['job_id']}/attempts")).json()
    [attempt] = attempts["attempts"]
    assert attempt["outcome"] == "succeeded"
    assert (attempt["input_tokens"], attempt["output_tokens"]) == (3, job["output_tokens"])
    assert attempt["first_token_ms"] <= attempt["duration_ms"]


def _scope():  # type: ignore[no-untyped-def]
    from projections.scope import Scope

    return Scope("acme", "alice", "member")
