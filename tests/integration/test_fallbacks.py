"""Provider fallbacks end to end (issue 48): a job that names other places to run moves on
when its provider is out, no longer serves the model, or cannot take the request's length;
each attempt's record says where it ran and why the job moved. Real processes: the API, a
worker and the mock provider speaking OpenAI's and Anthropic's protocols."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from temporalio.testing import WorkflowEnvironment

from projections.event_log import utcnow
from tests.conftest import (
    MockProviderServer,
    Stack,
    cli,
    cli_json,
    provider_settings,
    running_stack,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


async def run(stack: Stack, options: dict[str, Any], max_attempts: int = 4) -> dict[str, Any]:
    """The job settled; its prompt in `prompt` (the mock's log is by prompt)."""
    prompt = f"fallbacks {uuid.uuid4().hex}"
    accepted = await stack.submit(prompt, max_attempts=max_attempts, options=options)
    return {**await stack.settled(accepted["job_id"], timeout=40), "prompt": prompt}


async def attempts(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    listed = await stack.http.get(f"/v1/jobs/{job_id}/attempts")
    assert listed.status_code == 200, listed.text
    return list(listed.json()["attempts"])


async def test_an_outage_moves_the_job_on_after_one_retry_in_place(
    provider_stack: Stack, mock_provider: MockProviderServer
) -> None:
    job = await run(
        provider_stack,
        {
            "provider": "openai",
            "model": "mock:fail=500,503,500,500",
            "fallbacks": [{"provider": "anthropic", "model": "claude-standby"}],
        },
    )

    assert (job["state"], job["attempt"]) == ("succeeded", 3)
    ran = await attempts(provider_stack, job["job_id"])
    assert [(a["provider"], a["outcome"]) for a in ran] == [
        ("openai", "provider_5xx"),
        ("openai", "provider_5xx"),
        ("anthropic", "succeeded"),
    ]
    assert [a["moved_on"] for a in ran] == [
        None,
        "the provider failed 2 times in a row (provider_5xx)",
        None,
    ]
    answer = (await provider_stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert (answer["provider"], answer["model"]) == ("anthropic", "claude-standby")


@pytest.mark.parametrize(
    ("step", "why"),
    [
        ("no_model", "the provider does not serve the model"),
        ("too_long", "the request is over the model's context window"),
    ],
)
async def test_a_client_error_another_place_may_not_make_moves_on_at_once(
    provider_stack: Stack, mock_provider: MockProviderServer, step: str, why: str
) -> None:
    job = await run(
        provider_stack,
        {
            "provider": "anthropic",
            "model": f"mock:fail={step}",
            "fallbacks": [{"provider": "openai", "model": "gpt-standby"}],
            "tools": TOOLS,
        },
    )

    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    ran = await attempts(provider_stack, job["job_id"])
    assert [(a["provider"], a["outcome"], a["moved_on"]) for a in ran] == [
        ("anthropic", "provider_4xx", why),
        ("openai", "succeeded", None),
    ]
    # The whole request went to the next place unchanged: its tools too.
    sent = await mock_provider.requests(job["prompt"])
    assert [(r["api"], r["model"], r["tools"]) for r in sent] == [
        ("anthropic", f"mock:fail={step}", ["weather"]),
        ("openai", "gpt-standby", ["weather"]),
    ]


async def test_without_fallbacks_the_same_errors_fail_the_job_as_before(
    provider_stack: Stack,
) -> None:
    job = await run(provider_stack, {"provider": "openai", "model": "mock:fail=too_long"})
    assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "provider_4xx", 1)
    assert "maximum context length" in job["error_message"]


async def test_jobs_show_names_where_each_attempt_ran_and_why_the_job_moved(
    provider_stack: Stack,
) -> None:
    job = await run(
        provider_stack,
        {
            "provider": "openai",
            "model": "mock:fail=no_model",
            "fallbacks": [{"provider": "anthropic", "model": "claude-standby"}],
        },
    )
    shown = (await cli(provider_stack, "jobs", "show", job["job_id"])).output
    assert "provider_4xx; moved on: the provider does not serve the model" in shown
    assert "claude-standby" in shown
    as_json = await cli_json(provider_stack, "jobs", "show", job["job_id"])
    assert [a["moved_on"] for a in as_json["attempts"]] == [
        "the provider does not serve the model",
        None,
    ]


async def test_a_fallback_the_deployment_cannot_run_is_refused_at_the_door(
    provider_stack: Stack,
) -> None:
    refused = await provider_stack.http.post(
        "/v1/prompts",
        json={"prompt": "hello", "options": {"fallbacks": [{"provider": "nowhere"}]}},
    )
    assert refused.status_code == 422, refused.text
    assert "options.fallbacks[0]: unknown provider 'nowhere'" in refused.text


@pytest.fixture
async def routed_stack(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose operator named a route: its first place no longer serves the model."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[routes]\nsmart = ["anthropic/mock:fail=no_model", "openai/gpt-standby"]\n')
    settings = provider_settings(tmp_path, mock_provider, routes_file=routes)
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


async def test_a_route_runs_a_job_along_the_places_the_operator_named(
    routed_stack: Stack,
) -> None:
    job = await run(routed_stack, {"route": "smart", "max_tokens": 50})

    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    ran = await attempts(routed_stack, job["job_id"])
    assert [(a["provider"], a["model"]) for a in ran] == [
        ("anthropic", "mock:fail=no_model"),
        ("openai", "gpt-standby"),
    ]
    # The job keeps what the route named when it was submitted.
    shown = (await routed_stack.http.get(f"/v1/jobs/{job['job_id']}")).json()
    assert shown["options"]["fallbacks"] == [{"provider": "openai", "model": "gpt-standby"}]
    assert "route" not in shown["options"]

    unknown = await routed_stack.http.post(
        "/v1/prompts", json={"prompt": "hi", "options": {"route": "clever"}}
    )
    assert unknown.status_code == 422
    assert "unknown route 'clever'; the routes: smart" in unknown.text


async def test_the_openai_sdk_names_a_route_as_its_model(
    routed_stack: Stack, mock_provider: MockProviderServer
) -> None:
    client = AsyncOpenAI(
        base_url=f"{routed_stack.base_url}/v1", api_key=routed_stack.api_key, max_retries=0
    )
    listed = [model async for model in client.models.list()]
    [smart] = [m for m in listed if m.id == "smart"]
    assert smart.model_extra == {"places": ["anthropic/mock:fail=no_model", "openai/gpt-standby"]}

    prompt = f"route {uuid.uuid4().hex}"
    completion = await client.chat.completions.create(
        model="smart", messages=[{"role": "user", "content": prompt}]
    )
    assert completion.model == "smart"  # echoed as sent (docs/openai.md)
    assert completion.choices[0].message.content
    sent = await mock_provider.requests(prompt)
    assert [(r["api"], r["model"]) for r in sent] == [
        ("anthropic", "mock:fail=no_model"),
        ("openai", "gpt-standby"),
    ]


@pytest.fixture
async def circuit_stack(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose circuits open after 2 outage failures in a row at a place."""
    settings = provider_settings(
        tmp_path, mock_provider, circuit_failures=2, circuit_cooldown_s=60.0
    )
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


# Every job's first four requests there fail: the place is down for everyone.
DOWN = {"provider": "openai", "model": "mock:fail=503,503,503,503"}
STANDBY = [{"provider": "anthropic", "model": "claude-standby"}]


async def test_a_place_down_for_everyone_is_skipped_once_its_circuit_opens(
    circuit_stack: Stack, mock_provider: MockProviderServer
) -> None:
    first = await run(circuit_stack, {**DOWN, "fallbacks": STANDBY})
    # Its two failures opened the circuit (and moved it on by its own count).
    assert (first["state"], first["attempt"]) == ("succeeded", 3)

    later = await run(circuit_stack, {**DOWN, "fallbacks": STANDBY})
    # Straight to the next place: no attempt spent where the circuit is open, no request sent.
    assert (later["state"], later["attempt"]) == ("succeeded", 1)
    [ran] = await attempts(circuit_stack, later["job_id"])
    assert (ran["provider"], ran["model"]) == ("anthropic", "claude-standby")
    assert ran["via"] == (
        "circuit open at openai/mock:fail=503,503,503,503: started at the job's place 1 instead"
    )
    assert [r["api"] for r in await mock_provider.requests(later["prompt"])] == ["anthropic"]

    # A job with nowhere else to go still runs there (and fails there, as it would have).
    alone = await run(circuit_stack, DOWN, max_attempts=1)
    assert (alone["state"], alone["error_kind"]) == ("failed", "provider_5xx")

    status = await cli_json(circuit_stack, "status")
    [circuit] = status["circuits"]
    assert (circuit["place"], circuit["open"], circuit["opened"]) == (
        "openai/mock:fail=503,503,503,503",
        True,
        1,
    )
    scraped = (await circuit_stack.http.get("/metrics")).text
    assert 'promptjobs_circuit_open{place="openai/mock:fail=503,503,503,503"} 1.0' in scraped


async def test_a_job_kept_waiting_by_its_budget_moves_on_spending_no_attempt(
    provider_stack: Stack, mock_provider: MockProviderServer
) -> None:
    # Two requests a minute at the first place; eight jobs that may wait 1 s for it.
    place = f"openai/gpt-busy-{uuid.uuid4().hex[:6]}"
    await provider_stack.projection.store.budgets.set_limits(place, 2, None, utcnow())
    options = {
        "provider": "openai",
        "model": place.split("/", 1)[1],
        "fallbacks": STANDBY,
        "fallback_after_s": 1,
    }
    accepted = [
        (await provider_stack.submit(f"busy {i} {uuid.uuid4().hex}", options=options))["job_id"]
        for i in range(8)
    ]
    jobs = [await provider_stack.settled(job_id, timeout=40) for job_id in accepted]

    assert [(j["state"], j["attempt"]) for j in jobs] == [("succeeded", 1)] * 8
    ran = [(await attempts(provider_stack, j["job_id"]))[0] for j in jobs]
    first = [a for a in ran if a["provider"] == "openai"]
    moved = [a for a in ran if a["provider"] == "anthropic"]
    assert len(first) == 2 and len(moved) == 6, [(a["provider"], a["via"]) for a in ran]
    said = re.compile(
        rf"waited \d+ s for room in {re.escape(place)}'s budget: started at the job's place 1 "
        "instead"
    )
    assert all(said.fullmatch(a["via"]) for a in moved), [a["via"] for a in moved]
