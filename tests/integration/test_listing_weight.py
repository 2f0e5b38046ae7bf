"""One tenant's long options cannot make the API's listings, events and streams heavy: a
listed row or an event leaves options over 4 KiB out (flagged), the job's own read keeps
them, and a page of long prompts ends early, over real HTTP on SQLite and PostgreSQL."""

from __future__ import annotations

import json

from tests.conftest import Stack, eventually
from tests.integration.event_stream import all_terminal, read_events

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

# A `system` near the largest the API takes (it counts with the prompt against 100 kB).
SYSTEM = "Answer as a pirate would. " * 3_800


async def test_long_options_stay_out_of_listings_and_events_but_not_the_jobs_own_read(
    stack: Stack,
) -> None:
    options = {"system": SYSTEM, "fake": {"latency_ms": 0}}
    accepted = [await stack.submit(f"heavy {i}", options=options) for i in range(12)]
    light = await stack.submit("light", options={"fake": {"latency_ms": 0}})
    jobs = {a["job_id"] for a in accepted}
    for job_id in jobs | {light["job_id"]}:
        await stack.settled(job_id)

    listing = await stack.http.get("/v1/jobs", params={"since": "0", "limit": 500})
    rows = {row["job_id"]: row for row in listing.json()["jobs"]}
    assert all(rows[j]["options"] is None and rows[j]["options_omitted"] for j in jobs)
    assert rows[light["job_id"]]["options"] == {"fake": {"latency_ms": 0}}
    assert not rows[light["job_id"]]["options_omitted"]
    assert len(listing.content) < 100_000  # twelve 100 kB systems would be 1.2 MB

    one = await stack.job(accepted[0]["job_id"])
    assert one["options"]["system"] == SYSTEM and not one["options_omitted"]

    events = await read_events(stack.http, all_terminal(jobs), params={"since": "0"})
    heavy = [e.job for e in events if e.job_id in jobs]
    assert heavy and all(e["options"] is None and e["options_omitted"] for e in heavy)


async def test_a_page_of_long_prompts_ends_early_and_the_next_page_goes_on(stack: Stack) -> None:
    async with stack.as_user(await stack.key("acme", f"heavy-{id(stack)}")) as http:
        submitted = [
            (
                await http.post(
                    "/v1/prompts", json={"prompt": f"p{i}", "options": {"system": SYSTEM}}
                )
            ).json()["prompt_id"]
            for i in range(12)
        ]
        seen: list[str] = []
        pages: list[int] = []
        before: str | None = None
        while True:
            params = {"limit": "200", **({"before": before} if before else {})}
            page = await http.get("/v1/prompts", params=params)
            assert page.status_code == 200, page.text
            pages.append(len(page.content))
            body = page.json()
            seen += [p["prompt_id"] for p in body["prompts"]]
            before = body["next_before"]
            if before is None:
                break
        # Newest first, every prompt once, over more than one page of about 1 MiB at most.
        assert seen == submitted[::-1]
        assert len(pages) > 1 and max(pages) < 1_300_000, pages
        await eventually(
            lambda: http.get("/v1/prompts", params={"limit": "1"}),
            lambda r: json.loads(r.content)["prompts"][0]["jobs"][0]["options_omitted"],
        )


async def test_a_listing_and_an_event_cut_the_same_options(stack: Stack) -> None:
    """Measured alike (the stored JSON, in SQL for a listing, in Python for an event): 1,000
    `é` are 2 kB of UTF-8 but 6 kB of stored JSON, and both leave them out."""
    options = {"system": "é" * 1000, "fake": {"latency_ms": 0}}
    job_id = (await stack.submit("accents", options=options))["job_id"]
    await stack.settled(job_id)
    listing = await stack.http.get("/v1/jobs", params={"since": "0", "limit": 500})
    [row] = [row for row in listing.json()["jobs"] if row["job_id"] == job_id]
    events = await read_events(stack.http, all_terminal({job_id}), params={"since": "0"})
    streamed = [e.job for e in events if e.job_id == job_id]
    assert row["options_omitted"] and all(e["options_omitted"] for e in streamed)
    assert (await stack.job(job_id))["options"] == options
