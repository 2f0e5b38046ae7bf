"""Structured output through the API and a worker: an answer that matches the job's JSON
schema is part of its response; a miss runs again with a repair turn; a provider that never
complies fails the job as `schema_mismatch` with the errors; the door refuses what is no
schema."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import openai
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.conftest import MockProviderServer, Stack, cli, cli_json
from tests.integration.test_conversations import PROVIDERS

TICKET: dict[str, Any] = {
    "type": "object",
    "properties": {
        "category": {"type": "string", "enum": ["billing", "bug", "other"]},
        "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["category", "urgent", "tags"],
    "additionalProperties": False,
}


def schema_job(*answers: str, **options: Any) -> dict[str, Any]:
    return {
        "prompt": "Classify: my invoice is wrong",
        "options": {
            "output_schema": {"name": "ticket", "schema": TICKET},
            "fake": {"answers": list(answers)},
            **options,
        },
    }


async def test_an_answer_that_matches_is_part_of_the_response(stack: Stack) -> None:
    accepted = await stack.http.post("/v1/prompts", json=schema_job())
    assert accepted.status_code == 202, accepted.text
    job = await stack.settled(accepted.json()["job_id"])
    assert (job["state"], job["attempt"]) == ("succeeded", 1)
    answer = (await stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert answer["output_json"] == {"category": "billing", "urgent": True, "tags": ["mock"]}
    assert json.loads(answer["text"]) == answer["output_json"]


async def test_a_miss_is_repaired_by_the_next_attempt(stack: Stack) -> None:
    missing = json.dumps({"category": "billing", "urgent": True})
    accepted = await stack.http.post("/v1/prompts", json=schema_job(missing))
    job = await stack.settled(accepted.json()["job_id"])
    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    answer = (await stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert answer["output_json"]["tags"] == ["mock"]
    attempts = (await stack.http.get(f"/v1/jobs/{job['job_id']}/attempts")).json()["attempts"]
    assert [a["outcome"] for a in attempts] == ["schema_mismatch", "succeeded"]
    assert attempts[0]["errors"] == [{"path": "/", "message": '"tags" is a required property'}]
    assert attempts[1]["errors"] is None
    # Both attempts' usage counts on the job.
    assert job["output_tokens"] == sum(a["output_tokens"] for a in attempts)


async def test_a_provider_that_never_complies_fails_the_job_with_the_errors(
    stack: Stack,
) -> None:
    wrong = json.dumps({"category": "refund", "urgent": "yes", "tags": []})
    body = schema_job("not json at all", wrong, wrong)
    accepted = await stack.http.post("/v1/prompts", json={**body, "max_attempts": 3})
    job = await stack.settled(accepted.json()["job_id"])
    assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "schema_mismatch", 3)
    assert 'at /category: "refund" is not one of' in job["error_message"]
    assert 'at /urgent: "yes" is not of type "boolean"' in job["error_message"]
    attempts = (await stack.http.get(f"/v1/jobs/{job['job_id']}/attempts")).json()["attempts"]
    assert attempts[0]["errors"][0]["message"].startswith("not JSON: Expecting value")
    scraped = (await stack.http.get("/metrics")).text
    assert 'promptjobs_schema_checks_total{model="fake-1",outcome="miss",provider="fake"}' in (
        scraped
    )


async def test_jobs_show_shows_the_parsed_answer_and_each_miss(stack: Stack) -> None:
    missing = json.dumps({"category": "billing", "urgent": True})
    accepted = await stack.http.post("/v1/prompts", json=schema_job(missing))
    job = await stack.settled(accepted.json()["job_id"])
    shown = (await cli(stack, "jobs", "show", job["job_id"])).output
    assert "matches its output schema" in shown and '"tags": [\n' in shown
    assert 'schema_mismatch: at /: "tags" is a required property' in shown
    as_json = await cli_json(stack, "jobs", "show", job["job_id"])
    assert as_json["answer"]["output_json"]["tags"] == ["mock"]
    assert as_json["attempts"][0]["errors"][0]["path"] == "/"


async def test_what_is_no_schema_is_a_422_that_says_what_to_fix(stack: Stack) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "x", "schema": {"type": "objekt"}}, "is not JSON Schema"),
        ({"type": "json_schema", "schema": TICKET}, "unknown field"),
        ({"schema": None}, "leave `schema` out rather than send null"),
        ({"name": "bad name!", "schema": TICKET}, "name"),
        ({"name": "deep", "schema": deep_schema(40)}, "nests deeper than 32"),
        ({"schema": {"type": "string", "pattern": "["}}, "is not a 'regex'"),
    ]
    for output_schema, said in cases:
        response = await stack.http.post(
            "/v1/prompts", json={"prompt": "hi", "options": {"output_schema": output_schema}}
        )
        assert response.status_code == 422, (output_schema, response.text)
        assert said in response.text, response.text


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


async def test_a_retry_may_drop_the_schema(stack: Stack) -> None:
    accepted = await stack.http.post("/v1/prompts", json=schema_job("no", "no", "no"))
    failed = await stack.settled(accepted.json()["job_id"])
    assert failed["error_kind"] == "schema_mismatch"
    retried = await stack.http.post(
        f"/v1/jobs/{failed['job_id']}/retry",
        json={"options": {"fake": {"answers": ["plain words"]}}},
    )
    assert retried.status_code == 202, retried.text
    job = await stack.settled(retried.json()["job_id"])
    answer = (await stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert (answer["text"], answer["output_json"]) == ("plain words", None)


# -- on each provider's wire, against the mock --------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_each_provider_is_asked_for_the_schema_and_a_miss_is_repaired(
    provider_stack: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    question = f"Classify {uuid.uuid4().hex} mock:json_reply=missing"
    body = {
        "prompt": question,
        "options": {"provider": provider, "output_schema": {"name": "ticket", "schema": TICKET}},
    }
    accepted = await provider_stack.http.post("/v1/prompts", json=body)
    assert accepted.status_code == 202, accepted.text
    job = await provider_stack.settled(accepted.json()["job_id"], timeout=30)
    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    answer = (await provider_stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert answer["output_json"] == {"category": "billing", "urgent": True, "tags": ["mock"]}
    attempts = await provider_stack.http.get(f"/v1/jobs/{job['job_id']}/attempts")
    first, second = attempts.json()["attempts"]
    assert first["outcome"] == "schema_mismatch" and first["output_tokens"] > 0
    assert first["errors"] == [{"path": "/", "message": '"category" is a required property'}]
    assert second["outcome"] == "succeeded"
    # The provider was asked for the schema, its way, both times; the second time with the
    # answer that missed and why.
    asked = [r for r in await mock_provider.requests() if r["prompt"] == question]
    repaired = [
        r
        for r in await mock_provider.requests()
        if '"category" is a required' in r["prompt"] and r["api"] == provider
    ]
    assert len(asked) == 1 and len(repaired) == 1
    assert asked[0]["answer_schema"]["required"] == TICKET["required"]
    assert repaired[0]["answer_schema"] == asked[0]["answer_schema"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_provider_that_never_complies_fails_as_schema_mismatch(
    provider_stack: Stack, provider: str
) -> None:
    body = {
        "prompt": f"Classify {uuid.uuid4().hex}",
        "max_attempts": 2,
        "options": {
            "provider": provider,
            "model": "mock:json_reply=wrong",
            "output_schema": {"name": "ticket", "schema": TICKET},
        },
    }
    accepted = await provider_stack.http.post("/v1/prompts", json=body)
    job = await provider_stack.settled(accepted.json()["job_id"], timeout=30)
    assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "schema_mismatch", 2)
    assert 'at /category: 12345 is not of type "string"' in job["error_message"]
    scraped = (await provider_stack.http.get("/metrics")).text
    assert (
        f'promptjobs_schema_checks_total{{model="mock:json_reply=wrong",outcome="miss",'
        f'provider="{provider}"}} 2.0'
    ) in scraped


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_json_object_job_answers_an_object(provider_stack: Stack, provider: str) -> None:
    body = {
        "prompt": f"Any object {uuid.uuid4().hex}",
        "options": {"provider": provider, "output_schema": {}},
    }
    accepted = await provider_stack.http.post("/v1/prompts", json=body)
    job = await provider_stack.settled(accepted.json()["job_id"], timeout=30)
    answer = (await provider_stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert (job["state"], answer["output_json"]) == ("succeeded", {})


# -- the official SDK's helpers, unchanged ------------------------------------------------


class Ticket(BaseModel):
    category: Literal["billing", "bug", "other"]
    urgent: bool
    tags: list[str]


@pytest.mark.parametrize("model", ["openai/gpt-test", "anthropic/claude-test"])
async def test_chat_completions_parse_returns_the_model(provider_stack: Stack, model: str) -> None:
    client = sdk(provider_stack)
    completion = await client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": f"Classify {uuid.uuid4().hex}"}],
        response_format=Ticket,
    )
    assert completion.choices[0].message.parsed == Ticket(category="billing", urgent=True, tags=[])
    # A miss on the first attempt is repaired on the second; both attempts and their usage
    # are the job's.
    repaired = await client.chat.completions.parse(
        model=model,
        messages=[
            {"role": "user", "content": f"Classify {uuid.uuid4().hex} mock:json_reply=wrong"}
        ],
        response_format=Ticket,
    )
    assert repaired.choices[0].message.parsed == Ticket(category="billing", urgent=True, tags=[])
    job_id = repaired.model_extra["promptjobs"]["job_id"]  # type: ignore[index]
    attempts = await provider_stack.http.get(f"/v1/jobs/{job_id}/attempts")
    outcomes = [(a["outcome"], a["output_tokens"] > 0) for a in attempts.json()["attempts"]]
    assert outcomes == [("schema_mismatch", True), ("succeeded", True)]
    assert repaired.usage is not None and repaired.usage.completion_tokens == sum(
        a["output_tokens"] for a in attempts.json()["attempts"]
    )


@pytest.mark.parametrize("model", ["openai/gpt-test", "anthropic/claude-test"])
async def test_responses_parse_returns_the_model(provider_stack: Stack, model: str) -> None:
    client = sdk(provider_stack)
    response = await client.responses.parse(
        model=model, input=f"Classify {uuid.uuid4().hex}", text_format=Ticket
    )
    assert response.output_parsed == Ticket(category="billing", urgent=True, tags=[])
    assert response.text.format.type == "json_schema"  # type: ignore[union-attr]
    retrieved = await client.responses.retrieve(response.id)
    assert retrieved.text.format.name == "Ticket"  # type: ignore[union-attr]


@pytest.mark.parametrize("model", ["openai/gpt-test", "anthropic/claude-test"])
async def test_the_sdks_stream_helpers_show_the_json_grow_and_parse_it(
    provider_stack: Stack, model: str
) -> None:
    client = sdk(provider_stack)
    question = f"Classify {uuid.uuid4().hex} mock:chunk_ms=150"
    async with client.chat.completions.stream(
        model=model, messages=[{"role": "user", "content": question}], response_format=Ticket
    ) as chat:
        pieces = [e.delta async for e in chat if e.type == "content.delta"]
        final = await chat.get_final_completion()
    assert (
        len(pieces) > 1
        and json.loads("".join(pieces)) == final.choices[0].message.parsed.model_dump()
    )  # type: ignore[union-attr]
    async with client.responses.stream(
        model=model, input=f"Classify {uuid.uuid4().hex} mock:chunk_ms=150", text_format=Ticket
    ) as responses:
        deltas = [e.delta async for e in responses if e.type == "response.output_text.delta"]
        done = await responses.get_final_response()
    assert len(deltas) > 1
    assert done.output_parsed == Ticket(category="billing", urgent=True, tags=[])


async def test_a_format_that_is_no_schema_is_a_400_the_sdk_shows(provider_stack: Stack) -> None:
    client = sdk(provider_stack)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
    with pytest.raises(openai.BadRequestError, match="is not JSON Schema") as raised:
        await client.chat.completions.create(
            model="openai/gpt-test",
            messages=[{"role": "user", "content": "hi"}],
            response_format=bad,  # type: ignore[arg-type]
        )
    assert raised.value.param == "response_format"
    with pytest.raises(openai.BadRequestError, match=r"text\.format\.type"):
        await client.responses.create(
            model="openai/gpt-test",
            input="hi",
            text={"format": {"type": "xml"}},  # type: ignore[typeddict-item]
        )


def sdk(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0)
