"""The unmodified official `openai` SDK against the real stack: the Responses API's
background mode, a blocking create, cancel, and errors in OpenAI's shape."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from activities.adapters.fake import fake_output
from tests.conftest import Stack, eventually


def sdk(stack: Stack, key: str | None = None) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key or stack.api_key, max_retries=0)


async def test_background_create_then_poll_then_output_text(stack: Stack) -> None:
    client = sdk(stack)
    created = await client.responses.create(
        model="fake/any",
        input="Write a haiku",
        instructions="Be brief",
        metadata={"ticket": "T-1"},
        background=True,
        extra_body={"promptjobs": {"priority": 10, "options": {"fake": {"latency_ms": 300}}}},
    )
    assert created.id.startswith("resp_")
    assert created.status == "queued"
    assert created.background is True
    assert created.model == "fake/any"
    assert created.metadata == {"ticket": "T-1"}

    done = await eventually(
        lambda: client.responses.retrieve(created.id), lambda r: r.status == "completed"
    )
    assert done.output_text == fake_output("Write a haiku")
    assert done.usage is not None
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens > 0
    assert done.instructions == "Be brief"
    # The same job promptjobs' own routes show, with what the SDK sent.
    job_id = done.model_extra["promptjobs"]["job_id"]  # type: ignore[index]
    job = await stack.job(job_id)
    assert (job["state"], job["priority"]) == ("succeeded", 10)
    assert job["options"]["system"] == "Be brief"
    assert job["options"]["provider"] == "fake"


async def test_a_blocking_create_answers_the_completed_response(stack: Stack) -> None:
    response = await sdk(stack).responses.create(
        model="fake/any",
        input=[
            {"role": "developer", "content": "Answer in one line"},
            {"role": "user", "content": [{"type": "input_text", "text": "hello there"}]},
        ],
    )
    assert response.status == "completed"
    assert response.output_text == fake_output("hello there")
    assert response.background is False


async def test_the_sync_client_in_a_thread(stack: Stack) -> None:
    def run() -> tuple[str, str]:
        client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0)
        created = client.responses.create(model="fake/any", input="sync", background=True)
        return created.id, client.responses.retrieve(created.id).id

    created_id, read_id = await asyncio.to_thread(run)
    assert created_id == read_id


async def test_cancel_a_running_response_and_again_once_settled(stack: Stack) -> None:
    client = sdk(stack)
    created = await client.responses.create(
        model="fake/any",
        input="a long one",
        background=True,
        extra_body={"promptjobs": {"options": {"fake": {"latency_ms": 60_000}}}},
    )
    await eventually(
        lambda: client.responses.retrieve(created.id), lambda r: r.status == "in_progress"
    )
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    # Idempotent: a settled response is answered as it is.
    again = await client.responses.cancel(created.id)
    assert again.status == "cancelled"
    assert again.output_text == ""


async def test_a_failed_job_is_a_failed_response_with_its_error(stack: Stack) -> None:
    response = await sdk(stack).responses.create(
        model="fake/any",
        input="doomed",
        extra_body={"promptjobs": {"max_attempts": 1, "options": {"fake": {"fail": ["auth"]}}}},
    )
    assert response.status == "failed"
    assert response.error is not None
    assert response.error.message.startswith("auth:")


async def test_errors_come_in_openai_shape_and_as_the_sdk_classes(stack: Stack) -> None:
    client = sdk(stack)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.retrieve("resp_" + "0" * 32)
    assert missing.value.body["type"] == "invalid_request_error"  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as unsupported:
        await client.responses.create(
            model="fake/any",
            input="x",
            tools=[{"type": "web_search"}],  # type: ignore[list-item]
        )
    assert unsupported.value.param == "tools"
    assert unsupported.value.code == "unsupported_parameter"

    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="fake/any", input="x", temperature=9)
    assert bad.value.param == "temperature"

    # A name whose prefix is no provider of ours is a model of the default provider's (a
    # vLLM model is called `meta-llama/...`); a provider named in the options must exist.
    slashed = await client.responses.create(model="meta/llama", input="x", background=True)
    assert slashed.model == "meta/llama"
    with pytest.raises(openai.BadRequestError) as provider:
        await client.responses.create(
            model="any", input="x", extra_body={"promptjobs": {"options": {"provider": "nosuch"}}}
        )
    assert "unknown provider" in provider.value.message

    with pytest.raises(openai.AuthenticationError):
        await sdk(stack, key="pj_not_a_key").responses.retrieve("resp_x")


async def test_another_orgs_response_is_not_found(stack: Stack) -> None:
    created = await sdk(stack).responses.create(model="fake/any", input="mine", background=True)
    stranger = await stack.key("other-org", "eve", role="admin")
    with pytest.raises(openai.NotFoundError):
        await sdk(stack, stranger).responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await sdk(stack, stranger).responses.cancel(created.id)


async def test_an_idempotency_key_returns_the_first_response(stack: Stack) -> None:
    client = sdk(stack)
    headers = {"Idempotency-Key": "order-7"}
    first = await client.responses.create(
        model="fake/any", input="once", background=True, extra_headers=headers
    )
    second = await client.responses.create(
        model="fake/any", input="once", background=True, extra_headers=headers
    )
    assert second.id == first.id
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(
            model="fake/any", input="different", background=True, extra_headers=headers
        )


async def test_what_the_sdk_asks_for_that_is_not_here_says_so_in_openais_shape(
    stack: Stack,
) -> None:
    client = sdk(stack)
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.embeddings.create(model="fake/any", input="x")
    assert "Unknown request URL: POST /v1/embeddings" in unknown.value.message
    with pytest.raises(openai.NotFoundError) as nope:
        await client.responses.retrieve("resp_nope")
    assert "resp_nope" in nope.value.message and "pmt_" not in nope.value.message
    # Without the SDK, a client keeps promptjobs' own problem shape.
    plain = await stack.http.post("/v1/embeddings", json={"model": "fake/any", "input": "x"})
    assert plain.status_code == 404
    assert plain.headers["content-type"].startswith("application/problem+json")


async def test_files_list_in_either_order(stack: Stack) -> None:
    client = sdk(stack)
    made = []
    for name in ("a", "b", "c"):
        uploaded = await client.files.create(file=(f"{name}.jsonl", b"{}\n"), purpose="batch")
        made.append(uploaded.id)
    newest = [f.id async for f in client.files.list()]
    oldest = [f.id async for f in client.files.list(order="asc", limit=2)]
    assert newest == made[::-1]
    assert oldest == made
