"""A user retry that changes what the new job runs: options, priority and max_attempts in the
body of POST /v1/jobs/{id}/retry, each job's own options on its row, and the current
attempt's start."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import Stack, make_settings, parse_time, running_stack
from tests.integration.test_api_submit import assert_problem

RATE_LIMITED = {"fake": {"latency_ms": 5, "fail": ["rate_limit"], "retry_after_s": 1}}
# A provider failure that ends a one-attempt job (a 429 no longer does: it costs no attempt).
FAILING = {"fake": {"latency_ms": 5, "fail": ["provider_5xx"]}}
HEALTHY = {"fake": {"latency_ms": 5}}


@pytest.fixture
async def sqlite_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    settings = make_settings(tmp_path, database_url=f"sqlite:///{tmp_path / 'retry.db'}")
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


async def _failed(stack: Stack, **body: Any) -> dict[str, Any]:
    accepted = await stack.submit("weak model", max_attempts=1, options=FAILING, **body)
    job = await stack.settled(accepted["job_id"])
    assert job["state"] == "failed" and job["error_kind"] == "provider_5xx"
    return job


async def test_a_retry_with_new_options_runs_them_and_the_prompt_shows_each_jobs(
    sqlite_stack: Stack,
) -> None:
    stack = sqlite_stack
    failed = await _failed(stack, priority=80)
    assert failed["options"] == FAILING

    body = {"options": HEALTHY, "priority": 10, "max_attempts": 4}
    response = await stack.http.post(f"/v1/jobs/{failed['job_id']}/retry", json=body)
    assert response.status_code == 202, response.text
    new = response.json()
    assert new["supersedes"] == failed["job_id"]
    assert (new["options"], new["priority"], new["max_attempts"]) == (HEALTHY, 10, 4)

    done = await stack.settled(new["job_id"])
    # It ran the new options: one attempt, no failure.
    assert done["state"] == "succeeded" and done["attempt"] == 1

    prompt = (await stack.http.get(f"/v1/prompts/{failed['prompt_id']}")).json()
    assert prompt["options"] == FAILING  # the prompt keeps what was submitted
    assert [(j["options"], j["priority"]) for j in prompt["jobs"]] == [
        (FAILING, 80),
        (HEALTHY, 10),
    ]


async def test_an_empty_retry_repeats_the_last_jobs_options_priority_and_attempts(
    sqlite_stack: Stack,
) -> None:
    stack = sqlite_stack
    failed = await _failed(stack, priority=70)
    changed = await stack.http.post(
        f"/v1/jobs/{failed['job_id']}/retry", json={"options": HEALTHY, "max_attempts": 2}
    )
    second = await stack.settled(changed.json()["job_id"])
    assert (second["priority"], second["max_attempts"]) == (70, 2)  # priority kept

    # No body, then `{}`: each retry of the retry keeps what the retry changed.
    job = second
    for body in (None, {}):
        response = await stack.http.post(f"/v1/jobs/{job['job_id']}/retry", json=body)
        assert response.status_code == 202, response.text
        job = await stack.settled(response.json()["job_id"])
        assert job["state"] == "succeeded"
        assert (job["options"], job["priority"], job["max_attempts"]) == (HEALTHY, 70, 2)


INVALID_RETRIES: list[tuple[str, Any, str]] = [
    ("unknown field", {"prompt": "other"}, "body.prompt"),
    ("priority above 100", {"priority": 101}, "body.priority"),
    ("priority as text", {"priority": "5"}, "body.priority"),
    ("max_attempts 0", {"max_attempts": 0}, "body.max_attempts"),
    ("max_attempts 11", {"max_attempts": 11}, "body.max_attempts"),
    ("unknown option", {"options": {"colour": 1}}, "body.options.colour"),
    ("bad error kind", {"options": {"fake": {"fail": ["x"]}}}, "body.options.fake.fail.0"),
    ("array body", ["options"], "body"),
]  # fmt: skip


async def test_retry_bodies_are_validated_like_submissions_and_refusals_change_nothing(
    sqlite_stack: Stack,
) -> None:
    stack = sqlite_stack
    failed = await _failed(stack)
    url = f"/v1/jobs/{failed['job_id']}/retry"
    for name, body, field in INVALID_RETRIES:
        problem = assert_problem(await stack.http.post(url, json=body), 422, "validation")
        assert field in {error["field"] for error in problem["errors"]}, (name, problem)
    unknown = await stack.http.post(url, json={"options": {"provider": "nope"}})
    assert "unknown provider 'nope'" in assert_problem(unknown, 422, "invalid_options")["detail"]
    text = await stack.http.post(url, content=b"x", headers={"Content-Type": "text/plain"})
    assert_problem(text, 415, "unsupported_media_type")
    # None of the refused retries superseded the job.
    assert (await stack.job(failed["job_id"]))["state"] == "failed"


async def test_a_succeeded_job_can_be_retried_with_other_options(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    done = await stack.settled((await stack.submit("again", options=HEALTHY))["job_id"])
    assert done["state"] == "succeeded"
    slower = {"fake": {"latency_ms": 20}}
    response = await stack.http.post(f"/v1/jobs/{done['job_id']}/retry", json={"options": slower})
    assert response.status_code == 202, response.text
    again = await stack.settled(response.json()["job_id"])
    assert again["state"] == "succeeded" and again["options"] == slower


async def test_the_row_shows_when_the_current_attempt_started(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    accepted = await stack.submit("twice", options=RATE_LIMITED)
    job = await stack.settled(accepted["job_id"])
    assert job["state"] == "succeeded" and job["attempt"] == 2
    first, current = parse_time(job["started_at"]), parse_time(job["attempt_started_at"])
    # Attempt 2 waited out the 1 s Retry-After after attempt 1.
    assert (current - first).total_seconds() >= 1
    assert current <= parse_time(job["finished_at"])
