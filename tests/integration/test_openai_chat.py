"""The unmodified official `openai` SDK's Chat Completions against `promptjobs` (API, worker,
the mock provider behind it): an agent loop with a tool on either provider, blocking and
streamed, each call a job in /v1/jobs; `models.list`; errors in OpenAI's shape."""

from __future__ import annotations

import json
import uuid
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.conftest import MockProviderServer, Stack
from tests.integration.test_conversations import PIXEL, WEATHER

MODELS = ["openai/gpt-test", "anthropic/claude-test"]


def sdk(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0)


@pytest.mark.parametrize("model", MODELS)
async def test_an_agent_loop_calls_the_tool_then_answers_with_its_result(
    provider_stack: Stack, model: str
) -> None:
    client = sdk(provider_stack)
    result = f"18 C {uuid.uuid4().hex}"
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    asked = await client.chat.completions.create(model=model, messages=messages, tools=[WEATHER])
    choice = asked.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "mock"}  # type: ignore[union-attr]
    assert asked.model == model

    # The SDK's own message object goes back as it came, then the tool's result.
    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": result}]
    final = await client.chat.completions.create(model=model, messages=messages, tools=[WEATHER])
    assert final.choices[0].finish_reason == "stop"
    assert (final.choices[0].message.content or "").endswith(result)
    assert final.usage is not None and final.usage.total_tokens > 0

    # Each call is a job, with its usage, like any other.
    for completion in (asked, final):
        job_id = completion.model_extra["promptjobs"]["job_id"]  # type: ignore[index]
        job = await provider_stack.job(job_id)
        assert job["state"] == "succeeded"
        assert job["input_tokens"] == completion.usage.prompt_tokens  # type: ignore[union-attr]
    again = await client.chat.completions.retrieve(final.id)
    assert again.choices[0].message.content == final.choices[0].message.content


@pytest.mark.parametrize("model", MODELS)
async def test_a_streamed_call_sends_text_then_usage_then_done(
    provider_stack: Stack, model: str
) -> None:
    prompt = f"stream me {uuid.uuid4().hex}"
    stream = await sdk(provider_stack).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith(prompt)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("model", ["anthropic/claude-test", "openai/gpt-test"])
async def test_a_streamed_tool_call_arrives_in_pieces(provider_stack: Stack, model: str) -> None:
    stream = await sdk(provider_stack).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"weather? {uuid.uuid4().hex} mock:chunk_ms=150"}],
        tools=[WEATHER],
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    pieces = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    # The first piece names the call; its arguments follow as they stream, joined by index.
    first, *rest = pieces
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")  # type: ignore[union-attr]
    assert first.id and all(p.id is None and p.index == 0 for p in rest)
    assert len(pieces) > 2
    arguments = "".join(p.function.arguments or "" for p in pieces)  # type: ignore[union-attr]
    assert json.loads(arguments) == {"city": "mock"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_models_lists_each_provider_as_provider_slash_model(provider_stack: Stack) -> None:
    client = sdk(provider_stack)
    listed = [m async for m in client.models.list()]
    assert {m.owned_by for m in listed} == {"anthropic", "fake", "openai"}
    assert all(m.id.startswith(f"{m.owned_by}/") for m in listed)
    assert "fake/fake-1" in {m.id for m in listed}
    assert (await client.models.retrieve(listed[0].id)).id == listed[0].id
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nobody/none")


async def test_what_cannot_run_is_a_400_the_sdk_shows(provider_stack: Stack) -> None:
    client = sdk(provider_stack)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="openai/gpt-test", messages=[{"role": "user", "content": "x"}], logprobs=True
        )
    assert "logprobs" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as unanswered:
        await client.chat.completions.create(
            model="openai/gpt-test",
            messages=[
                {"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "call_nobody", "content": "r"},
            ],
        )
    assert "answers no call" in str(unanswered.value)


async def test_a_failed_job_is_an_error_the_sdk_does_not_retry(
    provider_stack: Stack, mock_provider: MockProviderServer
) -> None:
    prompt = f"fails {uuid.uuid4().hex} mock:fail=400"
    client = AsyncOpenAI(base_url=f"{provider_stack.base_url}/v1", api_key=provider_stack.api_key)
    with pytest.raises(openai.BadRequestError) as failed:
        await client.chat.completions.create(
            model="openai/gpt-test", messages=[{"role": "user", "content": prompt}]
        )
    assert "provider_4xx" in str(failed.value)
    # One job, one provider call: the SDK (max_retries=2 by default) did not send it again.
    assert len(await mock_provider.requests(prompt)) == 1


RESPONSES_TOOL: Any = {"type": "function", **WEATHER["function"]}


@pytest.mark.parametrize("model", MODELS)
async def test_a_responses_agent_loop_continues_from_the_previous_response(
    provider_stack: Stack, mock_provider: MockProviderServer, model: str
) -> None:
    client = sdk(provider_stack)
    question = f"Weather where this was taken? {uuid.uuid4().hex}"
    asked = await client.responses.create(
        model=model,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": question},
                    {"type": "input_image", "image_url": PIXEL, "detail": "auto"},
                ],
            }
        ],
        tools=[RESPONSES_TOOL],
    )
    [call] = [item for item in asked.output if item.type == "function_call"]
    assert call.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.arguments) == {"city": "mock"}  # type: ignore[union-attr]
    assert asked.tools[0].name == "get_weather"  # type: ignore[union-attr]

    result = f"18 C {uuid.uuid4().hex}"
    final = await client.responses.create(
        model=model,
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}],  # type: ignore[union-attr]
        tools=[RESPONSES_TOOL],
    )
    assert final.status == "completed"
    assert final.output_text.endswith(result)
    assert final.previous_response_id == asked.id
    # The provider was sent the whole conversation: the question and its image, the call,
    # the result.
    [first, second] = [
        r for r in await mock_provider.requests() if r["prompt"] in (question, result)
    ]
    assert (first["after_tool"], second["after_tool"]) == (False, True)
    assert second["images"] == first["images"] == ["base64 image/png"]


async def test_a_streamed_response_sends_its_function_call_events(provider_stack: Stack) -> None:
    stream = await sdk(provider_stack).responses.create(
        model="openai/gpt-test",
        input=f"weather? {uuid.uuid4().hex} mock:chunk_ms=150",
        tools=[RESPONSES_TOOL],
        stream=True,
    )
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.done" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "mock"}  # type: ignore[union-attr]
    # The arguments came as they streamed, in pieces that join to the whole.
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]  # type: ignore[union-attr]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments  # type: ignore[union-attr]
    assert kinds[-1] == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert [item.type for item in final.output] == ["function_call"]


async def test_previous_response_id_must_name_a_completed_response_of_the_caller(
    provider_stack: Stack,
) -> None:
    client = sdk(provider_stack)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(
            model="openai/gpt-test", input="x", previous_response_id="resp_nobody"
        )


async def batch_answers(client: AsyncOpenAI, lines: list[dict[str, Any]]) -> list[Any]:
    """Run `lines` as a `/v1/batches` batch of chat lines; their completions, in order."""
    from tests.integration.test_openai_batches import finished, jsonl, upload

    file_id = await upload(client, jsonl(lines))
    batch = await client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await finished(client, batch.id)
    assert done.status == "completed" and done.output_file_id, done
    output = (await client.files.content(done.output_file_id)).text.splitlines()
    by_id = {row["custom_id"]: row["response"]["body"] for row in map(json.loads, output)}
    return [by_id[line["custom_id"]] for line in lines]


@pytest.mark.parametrize("model", MODELS)
async def test_an_agent_loop_as_batch_files(provider_stack: Stack, model: str) -> None:
    client = sdk(provider_stack)
    messages: list[Any] = [{"role": "user", "content": f"weather? {uuid.uuid4().hex}"}]

    def line(custom_id: str) -> dict[str, Any]:
        body = {"model": model, "messages": messages, "tools": [WEATHER]}
        return {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }

    [asked] = await batch_answers(client, [line("ask")])
    assert asked["choices"][0]["finish_reason"] == "tool_calls"
    [call] = asked["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    result = f"18 C {uuid.uuid4().hex}"
    messages += [
        asked["choices"][0]["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]
    [final] = await batch_answers(client, [line("answer")])
    assert final["choices"][0]["message"]["content"].endswith(result)
    assert final["usage"]["total_tokens"] > 0


async def test_a_responses_batch_line_carries_tools_and_answers_a_function_call(
    provider_stack: Stack,
) -> None:
    from tests.integration.test_openai_batches import finished, jsonl, upload

    client = sdk(provider_stack)
    line = {
        "custom_id": "ask",
        "method": "POST",
        "url": "/v1/responses",
        "body": {
            "model": "openai/gpt-test",
            "input": [{"role": "user", "content": f"weather? {uuid.uuid4().hex}"}],
            "tools": [RESPONSES_TOOL],
        },
    }
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([line])),
        endpoint="/v1/responses",
        completion_window="24h",
    )
    done = await finished(client, batch.id)
    assert done.status == "completed" and done.output_file_id, done
    [row] = map(json.loads, (await client.files.content(done.output_file_id)).text.splitlines())
    output = row["response"]["body"]["output"]
    assert [(item["type"], item["name"]) for item in output] == [("function_call", "get_weather")]
