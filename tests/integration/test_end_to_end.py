"""The whole service over real HTTP: dev server, worker, API, SQLite and PostgreSQL."""

from __future__ import annotations

from activities.adapters.fake import fake_output
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

    states = [
        e.state.value
        for e in await stack.projection.store.events_since(
            _scope(), 0, 100, job_id=accepted["job_id"]
        )
    ]
    assert states == ["queued", "running", "succeeded"]


def _scope():  # type: ignore[no-untyped-def]
    from projections.scope import Scope

    return Scope("acme", "alice", "member")
