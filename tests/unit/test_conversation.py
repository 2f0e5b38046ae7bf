"""A conversation's rules at the door, and what each provider is sent for it: the same
messages and tools, in OpenAI's Chat Completions shapes and in Anthropic's Messages shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from activities.adapters.anthropic_messages import AnthropicMessagesAdapter
from activities.adapters.base import AdapterRequest, StreamedOutput
from activities.adapters.conversation import (
    InvalidConversation,
    check_conversation,
    parse_messages,
    transcript,
)
from activities.adapters.fake import FakeAdapter
from activities.adapters.openai_compat import OpenAICompatAdapter
from activities.adapters.options import PromptOptions

PIXEL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
# A whole agent turn: a question with an image, the model's call, the tool's answer.
LOOP: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Use tools."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Weather where this photo was taken?"},
            {"type": "image_url", "image_url": {"url": PIXEL}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'},
            }
        ],
        # As OpenAI's SDK hands an answer's message back: taken, not kept.
        "refusal": None,
        "annotations": [],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, clear"},
]


def request(messages: list[dict[str, Any]], **options: Any) -> AdapterRequest:
    parsed = parse_messages(messages)
    return AdapterRequest(
        "job_t",
        "pmt_t",
        transcript(parsed),
        attempt=1,
        options=PromptOptions.model_validate(options),
        messages=parsed,
    )


def openai_adapter() -> OpenAICompatAdapter:
    return OpenAICompatAdapter(
        api_key=SecretStr("k"),
        base_url=None,
        timeout_s=5,
        model="gpt-4o-mini",
        max_tokens=None,
        max_tokens_field="max_completion_tokens",
    )


def anthropic_adapter() -> AnthropicMessagesAdapter:
    return AnthropicMessagesAdapter(
        api_key=SecretStr("k"), base_url=None, timeout_s=5, model="claude", max_tokens=512
    )


def test_the_openai_body_is_the_conversation_with_developer_text_as_system() -> None:
    body = openai_adapter().body(
        request(LOOP, tools=[WEATHER], tool_choice="auto", stop=["END"], seed=7, top_p=0.5)
    )
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "system", "user", "assistant", "tool"]
    assistant = body["messages"][3]
    assert "refusal" not in assistant and "annotations" not in assistant
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    assert body["messages"][2]["content"][1] == {"type": "image_url", "image_url": {"url": PIXEL}}
    assert body["tools"] == [WEATHER]
    assert (body["tool_choice"], body["stop"], body["seed"], body["top_p"]) == (
        "auto",
        ["END"],
        7,
        0.5,
    )


def test_the_anthropic_params_carry_the_same_conversation_in_its_blocks() -> None:
    params = anthropic_adapter().params(
        request(
            LOOP, system="Answer in French.", tools=[WEATHER], tool_choice="required", stop="END"
        )
    )
    assert params["system"] == "Answer in French.\n\nBe brief.\n\nUse tools."
    user, assistant, results = params["messages"]
    assert user["role"] == "user"
    assert user["content"][1] == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": PIXEL.split(",", 1)[1],
        },
    }
    assert assistant == {
        "role": "assistant",
        "content": [
            {
                "type": "tool_use",
                "id": "call_1",
                "name": "get_weather",
                "input": {"city": "Paris", "unit": "C"},
            }
        ],
    }
    assert results == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18 C, clear"}],
    }
    assert params["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]
    assert params["tool_choice"] == {"type": "any"}
    assert params["stop_sequences"] == ["END"]


def test_anthropic_names_a_chosen_tool_and_turns_off_parallel_calls() -> None:
    params = anthropic_adapter().params(
        request(
            LOOP[2:3],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
        )
    )
    assert params["tool_choice"] == {
        "type": "tool",
        "name": "get_weather",
        "disable_parallel_tool_use": True,
    }


def test_a_plain_prompt_is_one_user_message_on_both() -> None:
    plain = AdapterRequest("job_t", "pmt_t", "hello", attempt=1)
    assert openai_adapter().body(plain)["messages"] == [{"role": "user", "content": "hello"}]
    assert anthropic_adapter().params(plain)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    ]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([{"role": "system", "content": "x"}], "at least one user message"),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "c9", "content": "r"},
            ],
            "answers no call",
        ),
        ([*LOOP, LOOP[-1]], "answered twice"),
    ],
)
def test_messages_that_make_no_conversation_are_refused(
    messages: list[dict[str, Any]], says: str
) -> None:
    with pytest.raises(InvalidConversation, match=says):
        check_conversation(parse_messages(messages))


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ({"role": "wizard", "content": "x"}, "messages[0]"),
        ({"role": "assistant"}, "needs `content` or `tool_calls`"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]},
            "http",
        ),
        (
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}
                ],
            },
            "data URL",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                ],
            },
            "JSON text",
        ),
    ],
)
def test_a_bad_message_is_refused_naming_its_field(message: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidConversation, match="messages\\[0\\]") as caught:
        parse_messages([message])
    assert says in str(caught.value)


def test_tools_are_json_schema_with_distinct_names_and_a_choice_among_them() -> None:
    with pytest.raises(ValidationError, match="not JSON Schema"):
        PromptOptions.model_validate(
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]}
        )
    with pytest.raises(ValidationError, match="same name"):
        PromptOptions.model_validate({"tools": [WEATHER, WEATHER]})
    with pytest.raises(ValidationError, match="not one of `tools`"):
        PromptOptions.model_validate(
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}}
        )
    with pytest.raises(ValidationError, match="needs `tools`"):
        PromptOptions.model_validate({"tool_choice": "required"})


def test_the_transcript_reads_a_line_a_message() -> None:
    assert transcript(parse_messages(LOOP)).splitlines() == [
        "system: Be brief.",
        "developer: Use tools.",
        "user: Weather where this photo was taken?[image]",
        "assistant: ",
        '→ get_weather({"city": "Paris", "unit": "C"})',
        "tool (call_1): 18 C, clear",
    ]


async def test_the_fake_calls_the_offered_tool_then_answers_its_result_in_text() -> None:
    fake = FakeAdapter(enabled=True)
    asked = await fake.complete(request(LOOP[:3], tools=[WEATHER]), StreamedOutput())
    assert asked.finish_reason == "tool_calls"
    assert asked.text == ""
    [call] = asked.tool_calls or []
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "mock", "unit": "C"}
    answered = await fake.complete(request(LOOP, tools=[WEATHER]), StreamedOutput())
    assert (answered.finish_reason, answered.tool_calls) == ("stop", None)
    assert "18 C, clear" in answered.text


def test_streamed_tool_calls_come_together_in_order() -> None:
    output = StreamedOutput()
    output.tool_call(1, call_id="b", name="second")
    output.tool_call(0, call_id="a", name="first")
    output.tool_call(0, arguments='{"x"')
    output.tool_call(0, arguments=": 1}")
    assert output.tool_calls == [
        {"id": "a", "name": "first", "arguments": '{"x": 1}'},
        {"id": "b", "name": "second", "arguments": "{}"},
    ]
