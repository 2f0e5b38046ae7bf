"""Chains on the embedded stack: a prompt that runs `after` others, with their answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.testing import WorkflowEnvironment

from activities.adapters.fake import fake_output
from tests.conftest import Stack, cli, cli_json, eventually, make_settings, running_stack
from tests.integration.processes import process_env, promptjobs_process, temporal_address
from tests.integration.test_api_submit import assert_problem

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

QUICK = {"fake": {"latency_ms": 5}}
SLOW = {"fake": {"latency_ms": 800}}
BROKEN = {"fake": {"fail": ["auth"]}}


@pytest.fixture
async def chain_stack(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """SQLite and PostgreSQL (the chain queries read JSON columns and a join)."""
    settings = make_settings(tmp_path, database_url=database_url)
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


async def _answer(stack: Stack, job: dict[str, Any]) -> str:
    response = await stack.http.get(f"/v1/responses/{job['response_id']}")
    assert response.status_code == 200, response.text
    text: str = response.json()["text"]
    return text


async def _prompt(stack: Stack, prompt_id: str) -> dict[str, Any]:
    response = await stack.http.get(f"/v1/prompts/{prompt_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _waiting(stack: Stack, job_id: str, on: list[str]) -> dict[str, Any]:
    return await eventually(
        lambda: stack.job(job_id),
        lambda j: j["state"] == "queued" and j["waiting_on"] == on,
        timeout=20,
    )


async def test_a_three_step_chain_runs_in_order_with_answers_substituted(
    chain_stack: Stack,
) -> None:
    stack = chain_stack
    a = await stack.submit("alpha", options=SLOW)
    b = await stack.submit("summarise: {{after[0]}}", after=[a["prompt_id"]], options=QUICK)
    c = await stack.submit(
        "{{ after[0] }} | {{after." + a["prompt_id"] + "}}",
        after=[b["prompt_id"], a["prompt_id"]],
        options=QUICK,
    )
    # The children wait, queued, and say on what.
    waiting = await stack.job(c["job_id"])
    assert waiting["state"] == "queued"
    assert waiting["waiting_on"] == [b["prompt_id"], a["prompt_id"]]

    done_c = await stack.settled(c["job_id"], timeout=30)
    done_a, done_b = await stack.job(a["job_id"]), await stack.job(b["job_id"])
    assert [j["state"] for j in (done_a, done_b, done_c)] == ["succeeded"] * 3
    assert done_a["finished_at"] <= done_b["started_at"]
    assert done_b["finished_at"] <= done_c["started_at"]
    assert done_c["waiting_on"] is None

    answer_a = fake_output("alpha")
    answer_b = fake_output(f"summarise: {answer_a}")
    assert await _answer(stack, done_b) == answer_b
    assert await _answer(stack, done_c) == fake_output(f"{answer_b} | {answer_a}")

    # Fan-out from A (B and C) and fan-in to C (B and A), seen from both ends.
    assert (await _prompt(stack, a["prompt_id"]))["children"] == [b["prompt_id"], c["prompt_id"]]
    shown_c = await _prompt(stack, c["prompt_id"])
    assert shown_c["after"] == [b["prompt_id"], a["prompt_id"]] and shown_c["children"] == []


async def test_a_failing_middle_step_retried_lets_the_chain_finish(chain_stack: Stack) -> None:
    stack = chain_stack
    a = await stack.submit("first", options=QUICK)
    b = await stack.submit("second: {{after[0]}}", after=[a["prompt_id"]], options=BROKEN)
    c = await stack.submit("third: {{after[0]}}", after=[b["prompt_id"]], options=QUICK)
    failed_b = await stack.settled(b["job_id"], timeout=30)
    assert failed_b["state"] == "failed"
    # C does not run: it stays queued, visibly waiting on B.
    await _waiting(stack, c["job_id"], [b["prompt_id"]])

    retry = await stack.http.post(f"/v1/jobs/{b['job_id']}/retry", json={"options": QUICK})
    assert retry.status_code == 202, retry.text
    new_b = await stack.settled(retry.json()["job_id"], timeout=30)
    done_c = await stack.settled(c["job_id"], timeout=30)

    assert (new_b["state"], done_c["state"]) == ("succeeded", "succeeded")
    answer_b = fake_output(f"second: {fake_output('first')}")
    assert await _answer(stack, new_b) == answer_b
    assert await _answer(stack, done_c) == fake_output(f"third: {answer_b}")


async def test_a_waiting_child_can_be_cancelled(chain_stack: Stack) -> None:
    stack = chain_stack
    a = await stack.submit("broken parent", options=BROKEN)
    child = await stack.submit("never: {{after[0]}}", after=[a["prompt_id"]], options=QUICK)
    assert (await stack.settled(a["job_id"]))["state"] == "failed"
    await _waiting(stack, child["job_id"], [a["prompt_id"]])
    # The Web UI shows the wait as the workflow's current details.
    metadata = await stack.client.get_workflow_handle(child["job_id"]).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert metadata.current_details.startswith("queued, waiting for parent prompt(s)")
    assert a["prompt_id"] in metadata.current_details
    # The operator is told what it waits on, and how to let it go on.
    shown = await cli_json(stack, "jobs", "show", child["job_id"])
    assert shown["waits_on"] == f"{a['prompt_id']} (job {a['job_id']} failed)"
    human = (await cli(stack, "jobs", "show", child["job_id"])).output
    assert f"waits on parent prompt(s) {a['prompt_id']}" in " ".join(human.split())

    response = await stack.http.post(f"/v1/jobs/{child['job_id']}/cancel")
    assert response.status_code == 202, response.text
    cancelled = await stack.settled(child["job_id"])
    assert (cancelled["state"], cancelled["attempt"], cancelled["started_at"]) == (
        "cancelled",
        0,
        None,
    )


async def test_a_childs_ceiling_ends_it_stuck_naming_the_parent(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path, database_url=f"sqlite:///{tmp_path / 'c.db'}", job_ceiling_s=3.0
    )
    async with running_stack(settings, dev_server.client) as stack:
        a = await stack.submit("never succeeds", options=BROKEN)
        child = await stack.submit("{{after[0]}}", after=[a["prompt_id"]], options=QUICK)
        job = await stack.settled(child["job_id"], timeout=30)
    assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "stuck", 0)
    assert a["prompt_id"] in job["error_message"]
    assert a["job_id"] in job["error_message"] and "failed" in job["error_message"]


async def test_bad_chains_are_refused_at_submission(chain_stack: Stack) -> None:
    stack = chain_stack
    a = await stack.submit("parent", options=QUICK)
    for prompt, after in (
        ("{{after[1]}}", [a["prompt_id"]]),
        ("{{after.pmt_elsewhere}}", [a["prompt_id"]]),
        ("{{after[0]}}", []),
        ("{{after-0}}", [a["prompt_id"]]),
    ):
        response = await stack.http.post("/v1/prompts", json={"prompt": prompt, "after": after})
        problem = assert_problem(response, 422, "unknown_placeholder")
        assert prompt.strip("{}") in problem["detail"] or "after" in problem["detail"]
    repeated = await stack.http.post(
        "/v1/prompts", json={"prompt": "x", "after": [a["prompt_id"], a["prompt_id"]]}
    )
    assert_problem(repeated, 422, "validation")
    unknown = await stack.http.post("/v1/prompts", json={"prompt": "x", "after": ["pmt_nope"]})
    assert_problem(unknown, 404, "not_found")
    # Another org's prompt is as unseen as a missing one.
    async with stack.as_user(await stack.key("globex", "gus")) as globex:
        theirs = await globex.post("/v1/prompts", json={"prompt": "x", "after": [a["prompt_id"]]})
    assert_problem(theirs, 404, "not_found")


async def test_a_worker_sigkilled_mid_chain_loses_nothing(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'kill.db'}",
        heartbeat_timeout_s=2.0,
        temporal_address=temporal_address(dev_server),
    )
    procs = tmp_path / "procs"
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", process_env(settings), procs) as first:
            a = await stack.submit("root", options={"fake": {"latency_ms": 4000}})
            b = await stack.submit("leaf: {{after[0]}}", after=[a["prompt_id"]], options=QUICK)
            await eventually(
                lambda: stack.job(a["job_id"]), lambda j: j["state"] == "running", timeout=30
            )
            await _waiting(stack, b["job_id"], [a["prompt_id"]])
            first.kill()  # SIGKILL while the parent runs and the child waits
        with promptjobs_process("worker", process_env(settings), procs):
            done_b = await stack.settled(b["job_id"], timeout=60)
        done_a = await stack.job(a["job_id"])
        assert (done_a["state"], done_a["attempt"]) == ("succeeded", 2)
        assert done_b["state"] == "succeeded"
        assert await _answer(stack, done_b) == fake_output(f"leaf: {fake_output('root')}")
