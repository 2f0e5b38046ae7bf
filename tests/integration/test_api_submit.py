"""POST /v1/prompts over real HTTP: idempotency, validation as problem details, size limits,
a prompt's job history, health and readiness."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.conftest import Stack, free_port, make_settings, running_stack

PROBLEM_FIELDS = {"type", "title", "status", "detail", "code"}


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = response.json()
    assert PROBLEM_FIELDS <= problem.keys()
    assert problem["status"] == status
    assert problem["code"] == code
    assert problem["type"] == f"/problems/{code}"
    assert problem["instance"] == response.request.url.path
    return problem


@pytest.fixture
async def small_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    """SQLite, and a prompt limit of 64 bytes (PROMPTJOBS_MAX_PROMPT_BYTES), no images inline."""
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'small.db'}",
        max_prompt_bytes=64,
        max_image_bytes=0,
    )
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


# -- Idempotency-Key ---------------------------------------------------------------------


async def test_same_idempotency_key_and_body_returns_the_original_job(stack: Stack) -> None:
    body = {"prompt": "charge once", "priority": 10, "options": {"fake": {"latency_ms": 1}}}
    headers = {"Idempotency-Key": "order-42"}

    first = await stack.http.post("/v1/prompts", json=body, headers=headers)
    again = await stack.http.post("/v1/prompts", json=body, headers=headers)

    assert first.status_code == again.status_code == 202
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.json()["prompt_id"] == first.json()["prompt_id"]
    assert again.headers["location"] == first.headers["location"]
    listing = (await stack.http.get("/v1/jobs", params={"since": "0"})).json()
    assert [job["job_id"] for job in listing["jobs"]] == [first.json()["job_id"]], listing


async def test_idempotent_replay_after_archive_of_the_original_answers_the_current_job(
    stack: Stack,
) -> None:
    body = {"prompt": "archived original", "options": {"fake": {"latency_ms": 1}}}
    headers = {"Idempotency-Key": "order-43"}
    first = (await stack.http.post("/v1/prompts", json=body, headers=headers)).json()
    await stack.settled(first["job_id"])
    retried = await stack.http.post(f"/v1/jobs/{first['job_id']}/retry")
    assert retried.status_code == 202, retried.text
    current = await stack.settled(retried.json()["job_id"])
    # The superseded original finished before its retry was created; the prompt stays.
    archived = await stack.projection.store.operations.archive(
        before=datetime.fromisoformat(current["created_at"])
    )
    assert archived.jobs == 1 and archived.prompts == 0

    again = await stack.http.post("/v1/prompts", json=body, headers=headers)

    assert again.status_code == 202, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["job_id"] == current["job_id"]
    assert again.json()["prompt_id"] == first["prompt_id"]


async def test_concurrent_retries_with_one_key_make_one_job(stack: Stack) -> None:
    headers = {"Idempotency-Key": "burst"}
    responses = await asyncio.gather(
        *(
            stack.http.post("/v1/prompts", json={"prompt": "once"}, headers=headers)
            for _ in range(6)
        )
    )
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["job_id"] for r in responses}) == 1


async def test_a_replayed_key_among_new_ones_answers_each_submit_its_own(stack: Stack) -> None:
    # A used key is told at the insert: the replay fails the transaction it shares with the
    # others (a group commit), whose submits must each still get their own new job.
    used = await stack.http.post(
        "/v1/prompts", json={"prompt": "first"}, headers={"Idempotency-Key": "used"}
    )
    assert used.status_code == 202, used.text

    async def submit(key: str, prompt: str) -> httpx.Response:
        return await stack.http.post(
            "/v1/prompts", json={"prompt": prompt}, headers={"Idempotency-Key": key}
        )

    fresh = [submit(f"new-{i}", f"new {i}") for i in range(24)]
    replays = [submit("used", "first") for _ in range(4)]
    conflicting = submit("used", "another body")
    answers = await asyncio.gather(*fresh, *replays, conflicting)

    new, replayed, conflict = answers[:24], answers[24:28], answers[28]
    assert [r.status_code for r in new + replayed] == [202] * 28
    assert not any("idempotent-replayed" in r.headers for r in new)
    assert len({r.json()["job_id"] for r in new}) == 24
    assert {r.json()["job_id"] for r in replayed} == {used.json()["job_id"]}
    assert all(r.headers["idempotent-replayed"] == "true" for r in replayed)
    assert_problem(conflict, 422, "idempotency_key_reused")
    listing = (await stack.http.get("/v1/jobs", params={"since": "0", "limit": 100})).json()
    assert len(listing["jobs"]) == 25


async def test_same_idempotency_key_with_another_body_is_422(stack: Stack) -> None:
    headers = {"Idempotency-Key": "order-43"}
    assert (
        await stack.http.post("/v1/prompts", json={"prompt": "a"}, headers=headers)
    ).status_code == 202

    reused = await stack.http.post("/v1/prompts", json={"prompt": "b"}, headers=headers)

    problem = assert_problem(reused, 422, "idempotency_key_reused")
    assert "different request body" in problem["detail"]


async def test_idempotency_keys_belong_to_their_user(stack: Stack) -> None:
    headers = {"Idempotency-Key": "shared-name"}
    mine = await stack.http.post("/v1/prompts", json={"prompt": "x"}, headers=headers)
    async with stack.as_user(await stack.key("acme", "bob")) as bob:
        theirs = await bob.post("/v1/prompts", json={"prompt": "x"}, headers=headers)
    assert mine.status_code == theirs.status_code == 202
    assert mine.json()["job_id"] != theirs.json()["job_id"]


# -- validation --------------------------------------------------------------------------


def _fake(behaviour: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": "x", "options": {"fake": behaviour}}


def _at(scheduled_for: str) -> dict[str, Any]:
    return {"prompt": "x", "scheduled_for": scheduled_for}


INVALID_BODIES: list[tuple[str, Any, str]] = [
    ("unknown field", {"prompt": "x", "colour": "red"}, "body.colour"),
    ("empty prompt", {"prompt": ""}, "body.prompt"),
    ("missing prompt", {"priority": 1}, "body"),
    ("priority above 100", {"prompt": "x", "priority": 101}, "body.priority"),
    ("priority below 0", {"prompt": "x", "priority": -1}, "body.priority"),
    ("priority as text", {"prompt": "x", "priority": "5"}, "body.priority"),
    ("priority as bool", {"prompt": "x", "priority": True}, "body.priority"),
    ("max_attempts 0", {"prompt": "x", "max_attempts": 0}, "body.max_attempts"),
    ("max_attempts 11", {"prompt": "x", "max_attempts": 11}, "body.max_attempts"),
    ("naive time", {"prompt": "x", "scheduled_for": "2030-01-01T00:00"}, "body.scheduled_for"),
    ("numeric scheduled_for", {"prompt": "x", "scheduled_for": 1e9}, "body.scheduled_for"),
    # Temporal would start it early (it caps a start delay at 100 years).
    ("scheduled too far", _at("2200-01-01T00:00:00Z"), "body.scheduled_for"),
    # In UTC, years 0 and 10000: they were a 500.
    ("scheduled before year 1 UTC", _at("0001-01-01T00:00:00+01:00"), "body.scheduled_for"),
    ("scheduled after year 9999 UTC", _at("9999-12-31T23:59:59-01:00"), "body.scheduled_for"),
    ("unknown option", {"prompt": "x", "options": {"colour": 1}}, "body.options.colour"),
    ("bad fake latency", _fake({"latency_ms": -1}), "body.options.fake.latency_ms"),
    ("bad fake error kind", _fake({"fail": ["meteor"]}), "body.options.fake.fail.0"),
    ("NUL in prompt", {"prompt": "a\u0000b"}, "body.prompt"),
    ("array body", ["prompt"], "body"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "field"), [case[1:] for case in INVALID_BODIES], ids=[c[0] for c in INVALID_BODIES]
)
async def test_invalid_bodies_are_422_naming_the_field(
    small_stack: Stack, body: Any, field: str
) -> None:
    response = await small_stack.http.post("/v1/prompts", json=body)
    problem = assert_problem(response, 422, "validation")
    assert field in {error["field"] for error in problem["errors"]}, problem
    assert problem["detail"].startswith("fix these fields: ")
    assert field in problem["detail"]


async def test_an_unknown_provider_is_422_saying_which_exist(small_stack: Stack) -> None:
    response = await small_stack.http.post(
        "/v1/prompts", json={"prompt": "x", "options": {"provider": "nope"}}
    )
    problem = assert_problem(response, 422, "invalid_options")
    assert "unknown provider 'nope'" in problem["detail"] and "fake" in problem["detail"]


async def test_malformed_json_is_422_saying_the_body_is_not_json(small_stack: Stack) -> None:
    response = await small_stack.http.post(
        "/v1/prompts", content=b'{"prompt": "x",', headers={"Content-Type": "application/json"}
    )
    problem = assert_problem(response, 422, "invalid_json")
    assert problem["detail"].startswith("the request body is not valid JSON")
    assert "JSON decode error" not in problem["detail"]


async def test_an_empty_body_is_422_saying_it_is_empty(small_stack: Stack) -> None:
    for headers in ({}, {"Content-Type": "application/json"}):
        response = await small_stack.http.post("/v1/prompts", content=b"", headers=headers)
        problem = assert_problem(response, 422, "validation")
        assert "the request body is empty" in problem["detail"]


async def test_a_body_that_is_not_json_is_415(small_stack: Stack) -> None:
    for headers in ({"Content-Type": "text/plain"}, {}):
        response = await small_stack.http.post(
            "/v1/prompts", content=b"prompt=hello", headers=headers
        )
        problem = assert_problem(response, 415, "unsupported_media_type")
        assert "Content-Type: application/json" in problem["detail"]


async def test_a_prompt_over_the_limit_is_413(small_stack: Stack) -> None:
    at_limit = await small_stack.http.post("/v1/prompts", json={"prompt": "é" * 32})
    assert at_limit.status_code == 202, at_limit.text

    over = await small_stack.http.post("/v1/prompts", json={"prompt": "é" * 33})

    problem = assert_problem(over, 413, "prompt_too_large")
    assert "66 bytes" in problem["detail"] and "limit is 64" in problem["detail"]


async def test_the_system_text_counts_against_the_prompt_limit(small_stack: Stack) -> None:
    body = {"prompt": "x" * 40, "options": {"system": "y" * 30}}
    over = await small_stack.http.post("/v1/prompts", json=body)

    problem = assert_problem(over, 413, "prompt_too_large")
    assert "70 bytes" in problem["detail"] and "options.system" in problem["detail"]


async def test_a_deeply_nested_body_is_422_saying_so(small_stack: Stack) -> None:
    nested = b'{"prompt": "x", "options": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = await small_stack.http.post(
        "/v1/prompts", content=nested, headers={"Content-Type": "application/json"}
    )
    problem = assert_problem(response, 422, "invalid_json")
    assert "nested" in problem["detail"] and "UTF-8" not in problem["detail"], problem


async def test_a_body_that_is_not_utf8_is_422_saying_so(small_stack: Stack) -> None:
    response = await small_stack.http.post(
        "/v1/prompts", content=b'{"prompt": "\xff"}', headers={"Content-Type": "application/json"}
    )
    problem = assert_problem(response, 422, "invalid_json")
    assert "UTF-8" in problem["detail"], problem


async def test_a_body_far_over_the_limit_is_refused_before_it_is_parsed(
    small_stack: Stack,
) -> None:
    response = await small_stack.http.post("/v1/prompts", json={"prompt": "x" * 200_000})
    problem = assert_problem(response, 413, "body_too_large")
    # It names the documented limit a user can act on, not only the body's bound.
    limit = small_stack.settings.max_prompt_bytes
    assert f"{limit:,} bytes of UTF-8" in problem["detail"], problem
    assert "PROMPTJOBS_MAX_PROMPT_BYTES" in problem["detail"]


async def test_unknown_routes_and_methods_are_problems(stack: Stack) -> None:
    assert_problem(await stack.http.get("/v1/nothing"), 404, "not_found")
    wrong = await stack.http.delete("/v1/prompts")
    assert_problem(wrong, 405, "method_not_allowed")
    assert "POST" in wrong.headers["allow"]


async def test_unauthenticated_requests_are_401_with_a_bearer_challenge(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        for headers, code in (
            ({}, "unauthenticated"),
            ({"Authorization": "Basic YWxpY2U6c2VjcmV0"}, "unauthenticated"),
            ({"Authorization": "Bearer pj_nokey_nosecret"}, "invalid_api_key"),
            ({"Authorization": f"Bearer {stack.api_key}x"}, "invalid_api_key"),
        ):
            response = await anonymous.post("/v1/prompts", json={"prompt": "x"}, headers=headers)
            assert_problem(response, 401, code)
            assert response.headers["www-authenticate"] == "Bearer"


# -- reads -------------------------------------------------------------------------------


async def test_a_prompt_shows_its_text_options_and_every_job(stack: Stack) -> None:
    options = {"fake": {"latency_ms": 5}}
    accepted = await stack.submit("history", options=options, correlation_id="c-1")
    first = await stack.settled(accepted["job_id"])
    second = (await stack.http.post(f"/v1/jobs/{first['job_id']}/retry")).json()
    await stack.settled(second["job_id"])

    prompt = (await stack.http.get(f"/v1/prompts/{accepted['prompt_id']}")).json()

    assert prompt["prompt"] == "history"
    assert prompt["options"] == options
    assert prompt["author"] == "alice" and prompt["correlation_id"] == "c-1"
    assert [job["job_id"] for job in prompt["jobs"]] == [first["job_id"], second["job_id"]]
    assert [job["state"] for job in prompt["jobs"]] == ["superseded", "succeeded"]
    assert prompt["jobs"][0]["superseded_by"] == second["job_id"]
    assert prompt["jobs"][1]["supersedes"] == first["job_id"]


async def test_unknown_ids_are_404(stack: Stack) -> None:
    for path in ("/v1/jobs/job_missing", "/v1/prompts/pmt_missing", "/v1/responses/x%00y"):
        assert_problem(await stack.http.get(path), 404, "not_found")
    assert_problem(await stack.http.post("/v1/jobs/job_missing/cancel"), 404, "not_found")


# -- health ------------------------------------------------------------------------------


async def test_healthz_and_readyz_answer_without_a_key(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        health = await anonymous.get("/healthz")
        ready = await anonymous.get("/readyz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"database": "ok", "temporal": "ok"}}


async def test_readyz_is_503_when_temporal_is_unreachable(tmp_path: Path) -> None:
    nowhere = await Client.connect(f"127.0.0.1:{free_port()}", lazy=True)
    settings = make_settings(tmp_path, database_url=f"sqlite:///{tmp_path / 'r.db'}")
    async with running_stack(settings, nowhere, run_worker=False) as stack:
        ready = await stack.http.get("/readyz")
        accepted = await stack.http.post("/v1/prompts", json={"prompt": "still accepted"})
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["temporal"].startswith("unreachable")
    assert accepted.status_code == 202


async def test_a_job_that_has_spent_nothing_has_no_cost_yet(stack: Stack) -> None:
    # Null until tokens were counted (never 0, then null once its model turns out unpriced).
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    accepted = await stack.submit("not yet", scheduled_for=later)
    job = await stack.job(accepted["job_id"])
    assert (job["state"], job["input_tokens"], job["cost_usd"]) == ("queued", 0, None)
