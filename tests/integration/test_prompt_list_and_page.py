"""GET /v1/prompts (newest first, scoped, paged), `access_token` on GET /v1/events only, and the
page at `/`, over real HTTP against SQLite and PostgreSQL."""

from __future__ import annotations

import json

import httpx

from tests.conftest import Stack


async def test_prompts_are_listed_newest_submitted_first_with_their_jobs(stack: Stack) -> None:
    # The first prompt is slow and the last is fast: completion order is the reverse of
    # submission order, and the list must still follow submission.
    slow = await stack.submit("first", options={"fake": {"latency_ms": 600}})
    middle = await stack.submit("second", options={"fake": {"latency_ms": 300}})
    fast = await stack.submit("third")
    for accepted in (slow, middle, fast):
        await stack.settled(accepted["job_id"])

    page = (await stack.http.get("/v1/prompts")).json()

    assert [p["prompt"] for p in page["prompts"]] == ["third", "second", "first"]
    assert page["next_before"] is None
    newest = page["prompts"][0]
    assert newest["prompt_id"] == fast["prompt_id"]
    assert [(j["job_id"], j["state"]) for j in newest["jobs"]] == [(fast["job_id"], "succeeded")]


async def test_prompt_list_pages_with_before_and_shows_retries(stack: Stack) -> None:
    submitted = [await stack.submit(f"prompt {i}") for i in range(5)]
    for accepted in submitted:
        await stack.settled(accepted["job_id"])
    retried = submitted[0]
    retry = (await stack.http.post(f"/v1/jobs/{retried['job_id']}/retry")).json()
    await stack.settled(retry["job_id"])

    seen: list[str] = []
    before: str | None = None
    while True:
        params = {"limit": "2", **({"before": before} if before else {})}
        page = (await stack.http.get("/v1/prompts", params=params)).json()
        seen += [p["prompt"] for p in page["prompts"]]
        before = page["next_before"]
        if before is None:
            break

    assert seen == [f"prompt {i}" for i in reversed(range(5))]
    oldest = (await stack.http.get(f"/v1/prompts/{retried['prompt_id']}")).json()
    assert [j["state"] for j in oldest["jobs"]] == ["superseded", "succeeded"]


async def test_prompt_list_is_scoped_to_the_caller(stack: Stack) -> None:
    await stack.submit("alice's")
    async with stack.as_user(await stack.key("acme", "bob")) as bob:
        await bob.post("/v1/prompts", json={"prompt": "bob's"})
        bobs = (await bob.get("/v1/prompts")).json()
    async with stack.as_user(await stack.key("globex", "carol", "admin")) as carol:
        others = (await carol.get("/v1/prompts")).json()
    async with stack.as_user(await stack.key("acme", "root", "admin")) as admin:
        whole_org = (await admin.get("/v1/prompts")).json()

    alices = (await stack.http.get("/v1/prompts")).json()
    assert [p["prompt"] for p in alices["prompts"]] == ["alice's"]
    assert [p["prompt"] for p in bobs["prompts"]] == ["bob's"]
    assert others["prompts"] == []
    assert sorted(p["prompt"] for p in whole_org["prompts"]) == ["alice's", "bob's"]

    foreign = await stack.http.get(
        "/v1/prompts", params={"before": bobs["prompts"][0]["prompt_id"]}
    )
    assert foreign.status_code == 404
    assert foreign.json()["code"] == "not_found"


async def test_prompt_list_cursor_follows_changes_made_after_the_read(stack: Stack) -> None:
    page = (await stack.http.get("/v1/prompts")).json()
    accepted = await stack.submit("after the read")
    await stack.settled(accepted["job_id"])

    changed = (await stack.http.get("/v1/jobs", params={"since": page["cursor"]})).json()

    assert [j["job_id"] for j in changed["jobs"]] == [accepted["job_id"]]


async def test_events_accept_the_key_as_access_token_for_eventsource(stack: Stack) -> None:
    accepted = await stack.submit("streamed")
    await stack.settled(accepted["job_id"])
    params = {"since": "0", "access_token": stack.api_key}

    async with (
        httpx.AsyncClient(base_url=stack.base_url, timeout=10) as anonymous,
        anonymous.stream("GET", "/v1/events", params=params) as stream,
    ):
        assert stream.status_code == 200
        states: list[str] = []
        event = ""
        async for line in stream.aiter_lines():
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            if line.startswith("data:") and event == "job.state_changed":
                states.append(json.loads(line.removeprefix("data:"))["state"])
            if len(states) == 3:
                break

    assert states == ["queued", "running", "succeeded"]


async def test_access_token_is_refused_everywhere_but_events(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as anonymous:
        jobs = await anonymous.get("/v1/jobs", params={"access_token": stack.api_key})
        wrong = await anonymous.get("/v1/events", params={"access_token": "pj_nope_nope"})
        missing = await anonymous.get("/v1/events")

    assert jobs.status_code == 401
    assert wrong.status_code == 401
    assert wrong.json()["code"] == "invalid_api_key"
    assert missing.status_code == 401
    assert missing.json()["code"] == "unauthenticated"


# The page's ES modules: app.js, the entry point, and what it imports.
SCRIPTS = (
    "app.js",
    "state.js",
    "api.js",
    "jobs.js",
    "cards.js",
    "actions.js",
    "compose.js",
    "follow.js",
)


async def test_the_page_is_served_without_a_key_and_kept_out_of_the_schema(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as anonymous:
        page = await anonymous.get("/")
        scripts = [await anonymous.get(f"/static/{name}") for name in SCRIPTS]
        style = await anonymous.get("/static/app.css")
        elsewhere = await anonymous.get("/static/../deps.py")
        unknown = await anonymous.get("/static/index.html.bak")
        schema = (await anonymous.get("/openapi.json")).json()

    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'id="compose"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert 'type="module" src="/static/app.js"' in page.text
    for script in scripts:
        assert script.status_code == 200, script.url
        assert script.headers["content-type"].startswith("text/javascript"), script.url
    assert style.headers["content-type"].startswith("text/css")
    assert elsewhere.status_code == 404
    assert unknown.status_code == 404
    assert "/" not in schema["paths"]
    assert not any(path.startswith("/static") for path in schema["paths"])
    assert "/v1/prompts" in schema["paths"] and "get" in schema["paths"]["/v1/prompts"]
