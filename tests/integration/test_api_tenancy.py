"""Orgs and roles over real HTTP: another org's objects are 404; members act on their own,
admins on the whole org; streams and lists never leak across either line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from projections.domain.lifecycle import JobState
from tests.conftest import Stack, eventually
from tests.integration.event_stream import all_terminal, read_events

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

LONG = {"fake": {"latency_ms": 3000}}
LATER = datetime.now(UTC) + timedelta(hours=1)


async def _submit(client: httpx.AsyncClient, prompt: str, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/prompts", json={"prompt": prompt, **body})
    assert response.status_code == 202, response.text
    accepted: dict[str, Any] = response.json()
    return accepted


async def _settled(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        response = await client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        row: dict[str, Any] = response.json()
        return row

    return await eventually(read, lambda row: JobState(row["state"]).is_terminal)


def _assert_not_found(response: httpx.Response) -> None:
    assert response.status_code == 404, (response.request.url, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "not_found"


async def _assert_cannot_touch(client: httpx.AsyncClient, job: dict[str, Any]) -> None:
    job_id, prompt_id = job["job_id"], job["prompt_id"]
    _assert_not_found(await client.get(f"/v1/jobs/{job_id}"))
    _assert_not_found(await client.post(f"/v1/jobs/{job_id}/cancel"))
    _assert_not_found(await client.post(f"/v1/jobs/{job_id}/retry"))
    _assert_not_found(await client.get(f"/v1/prompts/{prompt_id}"))
    _assert_not_found(await client.get("/v1/events", params={"job_id": job_id}))
    _assert_not_found(await client.get("/v1/events", params={"prompt_id": prompt_id}))
    if job.get("response_id"):
        _assert_not_found(await client.get(f"/v1/responses/{job['response_id']}"))
    listing = (await client.get("/v1/jobs", params={"since": "0", "limit": 500})).json()
    assert job_id not in {row["job_id"] for row in listing["jobs"]}


async def test_two_orgs_cannot_read_cancel_retry_or_stream_each_others_jobs(
    stack: Stack,
) -> None:
    acme = stack.http
    async with stack.as_user(await stack.key("globex", "gina", "admin")) as globex:
        # Running jobs (cancel is allowed for their owners) and settled ones (retry is).
        acme_running = await _submit(acme, "acme running", options=LONG)
        globex_running = await _submit(globex, "globex running", options=LONG)
        acme_done = await _settled(acme, (await _submit(acme, "acme done"))["job_id"])
        globex_done = await _settled(globex, (await _submit(globex, "globex done"))["job_id"])
        assert acme_done["response_id"] and globex_done["response_id"]

        for outsider, job in (
            (globex, acme_running),
            (globex, acme_done),
            (acme, globex_running),
            (acme, globex_done),
        ):
            await _assert_cannot_touch(outsider, job)

        # The owners' jobs went on untouched by the other org's cancel and retry attempts.
        for owner, job in ((acme, acme_running), (globex, globex_running)):
            assert (await _settled(owner, job["job_id"]))["state"] == "succeeded"
        for owner, job in ((acme, acme_done), (globex, globex_done)):
            assert (await owner.get(f"/v1/jobs/{job['job_id']}")).json()["superseded_by"] is None

        # Each org's stream of the whole log shows only its own jobs, up to its last one.
        for client, own in ((acme, acme_running), (globex, globex_running)):
            events = await read_events(client, all_terminal({own["job_id"]}), params={"since": "0"})
            owner_jobs = {
                row["job_id"]
                for row in (await client.get("/v1/jobs", params={"since": "0"})).json()["jobs"]
            }
            assert {e.job_id for e in events} <= owner_jobs
            assert own["job_id"] in {e.job_id for e in events}


async def test_member_sees_own_prompts_admin_sees_and_acts_on_the_whole_org(stack: Stack) -> None:
    alice = stack.http  # member of acme
    async with (
        stack.as_user(await stack.key("acme", "bob")) as bob,
        stack.as_user(await stack.key("acme", "carol", "admin")) as carol,
    ):
        # Scheduled an hour out, so it is still queued when the admin cancels it.
        alices = await _submit(alice, "alice's", scheduled_for=LATER.isoformat())
        bobs = await _settled(bob, (await _submit(bob, "bob's"))["job_id"])

        # Members: only their own.
        await _assert_cannot_touch(alice, bobs)
        await _assert_cannot_touch(bob, alices)

        # The admin sees both in the list and the stream...
        listing = (await carol.get("/v1/jobs", params={"since": "0"})).json()
        assert {alices["job_id"], bobs["job_id"]} <= {row["job_id"] for row in listing["jobs"]}
        streamed = await read_events(
            carol,
            lambda events: (
                bobs["job_id"] in {e.job_id for e in events}
                and alices["job_id"] in {e.job_id for e in events}
            ),
            params={"since": "0"},
        )
        assert {e.job_id for e in streamed} >= {alices["job_id"], bobs["job_id"]}

        # ...cancels alice's job and retries bob's.
        cancel = await carol.post(f"/v1/jobs/{alices['job_id']}/cancel")
        assert cancel.status_code == 202, cancel.text
        cancelled = await _settled(carol, alices["job_id"])
        assert cancelled["state"] == "cancelled", str(cancelled)

        retry = await carol.post(f"/v1/jobs/{bobs['job_id']}/retry")
        assert retry.status_code == 202, retry.text
        new_job = retry.json()
        assert new_job["supersedes"] == bobs["job_id"]

        # The retry belongs to bob's prompt, so bob still sees and owns it; alice does not.
        history = (await bob.get(f"/v1/prompts/{bobs['prompt_id']}")).json()
        assert [j["job_id"] for j in history["jobs"]] == [bobs["job_id"], new_job["job_id"]]
        assert history["author"] == "bob"
        assert (await bob.get(f"/v1/jobs/{new_job['job_id']}")).status_code == 200
        _assert_not_found(await alice.get(f"/v1/jobs/{new_job['job_id']}"))


async def test_two_authorization_headers_are_refused_with_400(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        response = await anonymous.get(
            "/v1/jobs",
            headers=[
                ("Authorization", f"Bearer {stack.api_key}"),
                ("Authorization", "Bearer someone-elses-key"),
            ],
        )
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "ambiguous_credentials"


async def test_nul_byte_in_a_key_is_an_invalid_key_not_a_server_error(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        streamed = await anonymous.get("/v1/events", params={"access_token": "pj_\x00nul"})
    assert streamed.status_code == 401, (streamed.status_code, streamed.text)
    assert streamed.json()["code"] == "invalid_api_key"
