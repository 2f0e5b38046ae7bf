"""One prompt's history is bounded (issue 22, item 4): retries stop at
PROMPTJOBS_MAX_JOBS_PER_PROMPT with a 409, and a listing of prompts carries only each
prompt's newest jobs and their count, whatever the retries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from projections import reads
from tests.conftest import Stack, make_settings, running_stack

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

LIMIT = 4


@pytest.fixture
async def capped(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    settings = make_settings(tmp_path, database_url=database_url, max_jobs_per_prompt=LIMIT)
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


async def retried_to_the_limit(stack: Stack) -> list[dict[str, Any]]:
    """A prompt with LIMIT jobs, each settled: the original and LIMIT - 1 retries."""
    jobs = [await stack.submit("again and again")]
    await stack.settled(jobs[0]["job_id"])
    while len(jobs) < LIMIT:
        response = await stack.http.post(f"/v1/jobs/{jobs[-1]['job_id']}/retry")
        assert response.status_code == 202, response.text
        jobs.append(response.json())
        await stack.settled(jobs[-1]["job_id"])
    return jobs


async def test_a_retry_past_the_limit_is_409_and_changes_nothing(capped: Stack) -> None:
    jobs = await retried_to_the_limit(capped)

    refused = await capped.http.post(f"/v1/jobs/{jobs[-1]['job_id']}/retry")

    assert refused.status_code == 409, refused.text
    problem = refused.json()
    assert problem["code"] == "retry_limit"
    assert problem["limit"] == LIMIT and problem["prompt_id"] == jobs[0]["prompt_id"]
    assert "submit the prompt again" in problem["detail"]
    current = await capped.job(jobs[-1]["job_id"])
    assert (current["state"], current["superseded_by"]) == ("succeeded", None)
    page = (await capped.http.get(f"/v1/prompts/{jobs[0]['prompt_id']}")).json()
    assert page["job_count"] == LIMIT
    assert [j["job_id"] for j in page["jobs"]] == [j["job_id"] for j in jobs]


async def test_a_listing_shows_each_prompts_newest_jobs_and_their_count(
    capped: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "LISTED_JOBS", 2)
    jobs = await retried_to_the_limit(capped)
    single = await capped.submit("once")
    await capped.settled(single["job_id"])

    listed = {p["prompt_id"]: p for p in (await capped.http.get("/v1/prompts")).json()["prompts"]}

    retried = listed[jobs[0]["prompt_id"]]
    assert retried["job_count"] == LIMIT
    # The newest two, oldest first: the last is still the current job.
    assert [j["job_id"] for j in retried["jobs"]] == [j["job_id"] for j in jobs[-2:]]
    once = listed[single["prompt_id"]]
    assert (once["job_count"], [j["job_id"] for j in once["jobs"]]) == (1, [single["job_id"]])
