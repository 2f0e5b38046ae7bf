"""GET /v1/jobs?since= over real HTTP: change-ordered pages that skip nothing while jobs are
being submitted and run, on SQLite and PostgreSQL, served from indexes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from sqlalchemy import text

from projections.domain.lifecycle import JobState
from projections.reads import changed_since_query, events_query
from projections.scope import Scope
from promptjobs.runtime import Projection
from tests.conftest import Stack, eventually

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

SUBMITTERS = 3
JOBS_EACH = 12


async def test_a_client_paging_until_caught_up_sees_every_jobs_final_state(stack: Stack) -> None:
    submitted: set[str] = set()
    submitting_done = asyncio.Event()

    async def submit_many(worker: int) -> None:
        rng = random.Random(worker)
        for i in range(JOBS_EACH):
            options = {"fake": {"latency_ms": rng.randrange(0, 150)}}
            accepted = await stack.submit(f"paged {worker}-{i}", options=options)
            submitted.add(accepted["job_id"])

    async def submit_all() -> None:
        await asyncio.gather(*(submit_many(w) for w in range(SUBMITTERS)))
        submitting_done.set()

    seen: dict[str, dict[str, Any]] = {}
    cursor = "0"
    cursors: list[int] = []

    async def page() -> bool:
        """One page; True once every job is submitted and seen settled (caught up)."""
        nonlocal cursor
        response = await stack.http.get("/v1/jobs", params={"since": cursor, "limit": 7})
        assert response.status_code == 200, response.text
        body = response.json()
        for row in body["jobs"]:
            seen[row["job_id"]] = row
        cursor = body["next_cursor"]
        cursors.append(int(cursor))
        settled = all(JobState(row["state"]).is_terminal for row in seen.values())
        return (
            submitting_done.is_set() and seen.keys() == submitted and settled and not body["jobs"]
        )

    submitter = asyncio.create_task(submit_all())
    await eventually(page, lambda caught_up: caught_up, timeout=60, interval=0.02)
    await submitter

    assert cursors == sorted(cursors), "the cursor went backwards"
    assert len(seen) == SUBMITTERS * JOBS_EACH
    for job_id, row in seen.items():
        assert row == await stack.job(job_id)
        assert row["state"] == "succeeded"


async def test_a_page_lists_changes_oldest_first_and_limit_splits_them(stack: Stack) -> None:
    ids = [(await stack.submit(f"ordered {i}"))["job_id"] for i in range(3)]
    for job_id in ids:
        await stack.settled(job_id)

    whole = (await stack.http.get("/v1/jobs", params={"since": "0"})).json()
    first = (await stack.http.get("/v1/jobs", params={"since": "0", "limit": 2})).json()
    rest = (await stack.http.get("/v1/jobs", params={"since": first["next_cursor"]})).json()
    caught_up = (await stack.http.get("/v1/jobs", params={"since": rest["next_cursor"]})).json()

    assert [j["job_id"] for j in first["jobs"]] + [j["job_id"] for j in rest["jobs"]] == [
        j["job_id"] for j in whole["jobs"]
    ]
    finished = [j["finished_at"] for j in whole["jobs"]]
    assert finished == sorted(finished)
    assert caught_up == {"jobs": [], "next_cursor": rest["next_cursor"]}


async def test_state_filter_and_a_cursor_that_moves_even_when_nothing_matches(
    stack: Stack,
) -> None:
    ok = await stack.submit("fine")
    await stack.settled(ok["job_id"])

    nothing = (await stack.http.get("/v1/jobs", params={"since": "0", "state": "failed"})).json()
    assert nothing["jobs"] == []
    assert int(nothing["next_cursor"]) > 0, "the cursor should move past what was scanned"

    bad = await stack.submit("broken", options={"fake": {"fail": ["provider_4xx"]}})
    await stack.settled(bad["job_id"])
    failed = (
        await stack.http.get(
            "/v1/jobs", params={"since": nothing["next_cursor"], "state": "failed"}
        )
    ).json()
    assert [j["job_id"] for j in failed["jobs"]] == [bad["job_id"]]
    assert failed["jobs"][0]["error_kind"] == "provider_4xx"


@pytest.mark.parametrize(
    "params",
    [
        {"since": "abc"},
        {"since": "-3"},
        {"since": "1" * 19},
        {"limit": "0"},
        {"limit": "501"},
        {"state": "done"},
    ],
)
async def test_bad_polling_parameters_are_422_problems(
    stack: Stack, params: dict[str, str]
) -> None:
    response = await stack.http.get("/v1/jobs", params=params)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    (name,) = params
    assert problem["errors"][0]["field"] == f"query.{name}"
    if name == "since":
        assert "not a cursor" in problem["detail"]


# -- the queries behind the pages are index range scans ----------------------------------

MEMBER = Scope("acme", "alice", "member")
ADMIN = Scope("acme", "carol", "admin")

QUERIES = {
    "admin page": (changed_since_query(ADMIN, 5, 100), "ix_jobs_org_last_event"),
    "member page": (changed_since_query(MEMBER, 5, 100), "ix_jobs_org_author_last_event"),
    "admin page by state": (
        changed_since_query(ADMIN, 5, 100, JobState.FAILED),
        "ix_jobs_org_state_last_event",
    ),
    "member page by state": (
        changed_since_query(MEMBER, 5, 100, JobState.FAILED),
        "ix_jobs_org_author_state_last_event",
    ),
    "admin stream": (events_query(ADMIN, 5, 200), "ix_job_events_org_id"),
    "member stream": (events_query(MEMBER, 5, 200), "ix_job_events_org_author_id"),
    # Filtered streams: the job's (or prompt's) index, or the caller's; either way an index
    # range in id order (SQLite without statistics prefers the caller's).
    "job stream": (events_query(MEMBER, 5, 200, job_id="job_x"), "ix_job_events_"),
    "prompt stream": (events_query(ADMIN, 5, 200, prompt_id="pmt_x"), "ix_job_events_"),
}


@pytest.mark.parametrize("name", list(QUERIES))
async def test_polling_and_stream_queries_use_their_index(
    projection: Projection, name: str
) -> None:
    query, index = QUERIES[name]
    dialect = projection.engine.dialect
    sql = str(query.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    async with projection.engine.connect() as conn:
        if dialect.name == "sqlite":
            plan = " ".join(
                str(row[-1]) for row in await conn.execute(text(f"EXPLAIN QUERY PLAN {sql}"))
            )
            assert f"USING INDEX {index}" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
        else:
            # Empty test tables make a sequential scan cheapest; forbid it to see the plan
            # PostgreSQL uses once the tables are large.
            await conn.execute(text("SET enable_seqscan = off"))
            plan = " ".join(str(row[0]) for row in await conn.execute(text(f"EXPLAIN {sql}")))
            assert "Index" in plan and "Seq Scan" not in plan and "Sort" not in plan, plan
