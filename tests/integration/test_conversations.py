"""A job is a whole model request: a conversation with tools and images, run through the API,
a worker and each provider's real SDK against the mock provider, the same job on either
provider; and what the door refuses."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import MockProviderServer, Stack, cli, running_stack

PROVIDERS = ["openai", "anthropic"]
PIXEL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


async def run(stack: Stack, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Submit, wait for the job to succeed, and read its response."""
    accepted = await stack.http.post("/v1/prompts", json=body)
    assert accepted.status_code == 202, accepted.text
    job = await stack.settled(accepted.json()["job_id"], timeout=30)
    assert job["state"] == "succeeded", job
    answer = (await stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    return job, answer


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_agent_loop_with_a_tool_and_an_image_runs_on_either_provider(
    provider_stack: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    question = f"Weather where this photo was taken? {uuid.uuid4().hex}"
    result = f"18 C and clear {uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": PIXEL}},
            ],
        },
    ]
    options = {"provider": provider, "tools": [WEATHER]}
    job, asked = await run(provider_stack, {"messages": messages, "options": options})
    assert asked["finish_reason"] == "tool_calls"
    [call] = asked["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "mock"}
    assert job["input_tokens"] > 0 and job["output_tokens"] > 0

    # The client runs the tool and sends its result, appending the answer as it got it.
    messages += [
        {"role": "assistant", "content": None, "tool_calls": asked["tool_calls"]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]
    _, final = await run(provider_stack, {"messages": messages, "options": options})
    assert final["finish_reason"] == "stop"
    assert final["tool_calls"] is None
    assert final["text"].endswith(result)

    # The provider saw the image in its own format, and the tool's result as the last turn.
    seen = [r for r in await mock_provider.requests() if r["prompt"] in (question, result)]
    assert [(r["api"], r["after_tool"], r["images"]) for r in seen] == [
        (provider, False, ["base64 image/png"]),
        (provider, True, ["base64 image/png"]),
    ]
    assert seen[0]["tools"] == ["get_weather"]
    assert seen[0]["system"] == "Be brief."

    # The operator's `jobs show` reads the conversation and the call.
    shown = (await cli(provider_stack, "jobs", "show", job["job_id"])).output
    assert f"user: {question}[image]" in shown
    assert '→ get_weather({"city": "mock"})' in shown

    # The prompt reads as a conversation: its messages as sent, and a transcript.
    prompt = (await provider_stack.http.get(f"/v1/prompts/{job['prompt_id']}")).json()
    assert prompt["messages"][1]["content"][0]["text"] == question
    assert prompt["prompt"].splitlines()[:2] == ["system: Be brief.", f"user: {question}[image]"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_tool_choice_none_answers_in_text(provider_stack: Stack, provider: str) -> None:
    prompt = f"just talk {uuid.uuid4().hex}"
    options = {"provider": provider, "tools": [WEATHER], "tool_choice": "none"}
    _, answer = await run(provider_stack, {"prompt": prompt, "options": options})
    assert answer["tool_calls"] is None
    assert answer["text"].endswith(prompt)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "not both"),
        ({}, "not both"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "call_9", "content": "r"},
                ]
            },
            "answers no call",
        ),
        (
            {
                "prompt": "x",
                "options": {
                    "tools": [
                        {"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}
                    ]
                },
            },
            "not JSON Schema",
        ),
        (
            {"prompt": "x", "options": {"provider": "anthropic", "seed": 3}},
            "has no seed",
        ),
    ],
)
async def test_what_makes_no_conversation_is_a_422_saying_what_to_fix(
    provider_stack: Stack, body: dict[str, Any], says: str
) -> None:
    refused = await provider_stack.http.post("/v1/prompts", json=body)
    assert refused.status_code == 422, refused.text
    assert says in refused.text


async def test_images_past_the_inline_limit_are_refused(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Any
) -> None:
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, database_url=database_url, max_image_bytes=40)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        image = {"type": "image_url", "image_url": {"url": PIXEL}}
        refused = await stack.http.post(
            "/v1/prompts",
            json={
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, image]}]
            },
        )
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "images_too_large"
    assert "https:// URL" in refused.json()["detail"]
