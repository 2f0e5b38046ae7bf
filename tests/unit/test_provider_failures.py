"""Classification of provider failures and validation of provider options, without a network."""

from __future__ import annotations

import email.utils
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from activities.adapters import anthropic_messages, openai_compat
from activities.adapters.base import InvalidOptions, StreamedOutput
from activities.adapters.chat import StreamedAnswer, read_event, retry_after_s, status_kind
from activities.errors import AdapterError
from projections.domain.lifecycle import ErrorKind
from promptjobs.runtime import build_adapters
from promptjobs.settings import Settings

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ErrorKind.PROVIDER_4XX),
        (401, ErrorKind.AUTH),
        (402, ErrorKind.PROVIDER_4XX),
        (403, ErrorKind.AUTH),
        (404, ErrorKind.PROVIDER_4XX),
        (408, ErrorKind.TIMEOUT),
        (409, ErrorKind.PROVIDER_4XX),
        (413, ErrorKind.PROVIDER_4XX),
        (422, ErrorKind.PROVIDER_4XX),
        (429, ErrorKind.RATE_LIMIT),
        (500, ErrorKind.PROVIDER_5XX),
        (502, ErrorKind.PROVIDER_5XX),
        (503, ErrorKind.PROVIDER_5XX),
        (504, ErrorKind.PROVIDER_5XX),
        (529, ErrorKind.PROVIDER_5XX),
        (302, ErrorKind.UNKNOWN),
    ],
)
def test_http_status_maps_to_error_kind(status: int, kind: ErrorKind) -> None:
    assert status_kind(status) is kind


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "7"}, 0.25),
        ({"retry-after-ms": "soon", "retry-after": "7"}, 7.0),
        ({"retry-after": email.utils.formatdate(NOW + 30, usegmt=True)}, 30.0),
        ({"retry-after": email.utils.formatdate(NOW - 30, usegmt=True)}, 0.0),
        ({"retry-after": "-5"}, 0.0),
        ({"retry-after": "tomorrow"}, None),
        ({"retry-after": "inf"}, None),
        ({}, None),
    ],
)
def test_retry_after_reads_seconds_milliseconds_and_dates(
    headers: dict[str, str], expected: float | None
) -> None:
    assert retry_after_s(httpx2.Headers(headers), now=NOW) == expected


def _response(status: int, headers: dict[str, str] | None = None) -> httpx2.Response:
    request = httpx2.Request("POST", "https://provider.example/v1/chat/completions")
    return httpx2.Response(status, headers=headers, request=request)


def test_openai_rate_limit_carries_retry_after_and_request_id() -> None:
    response = _response(429, {"retry-after": "3", "x-request-id": "req_42"})
    err = openai.RateLimitError(
        "Error code: 429", response=response, body={"message": "slow down", "code": None}
    )
    failure = openai_compat.classify(err)
    assert failure.kind is ErrorKind.RATE_LIMIT
    assert failure.retry_after_s == 3.0
    assert failure.message == "openai: HTTP 429: slow down (request req_42)"


def test_openai_insufficient_quota_is_not_retried_as_a_rate_limit() -> None:
    body = {"message": "You exceeded your current quota", "code": "insufficient_quota"}
    err = openai.RateLimitError("Error code: 429", response=_response(429), body=body)
    failure = openai_compat.classify(err)
    assert failure.kind is ErrorKind.PROVIDER_4XX
    assert not failure.kind.is_retryable
    assert "insufficient_quota" in failure.message


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda r: openai.APITimeoutError(request=r.request), ErrorKind.TIMEOUT),
        (lambda r: openai.APIConnectionError(request=r.request), ErrorKind.PROVIDER_5XX),
        (lambda r: openai.APIResponseValidationError(r, body="<html>"), ErrorKind.PARSE),
        (lambda r: openai.OpenAIError("something new"), ErrorKind.UNKNOWN),
    ],
)
def test_openai_failures_without_status(make: Any, kind: ErrorKind) -> None:
    assert openai_compat.classify(make(_response(200))).kind is kind


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda r: anthropic.APITimeoutError(request=r.request), ErrorKind.TIMEOUT),
        (lambda r: anthropic.APIConnectionError(request=r.request), ErrorKind.PROVIDER_5XX),
        (lambda r: anthropic.APIResponseValidationError(r, body="<html>"), ErrorKind.PARSE),
        (lambda r: anthropic.CredentialsError("no profile"), ErrorKind.AUTH),
        (lambda r: anthropic.AnthropicError("something new"), ErrorKind.UNKNOWN),
    ],
)
def test_anthropic_failures_without_status(make: Any, kind: ErrorKind) -> None:
    assert anthropic_messages.classify(make(_response(200))).kind is kind


def test_anthropic_overloaded_is_a_5xx_with_the_api_message() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    response = _response(529, {"request-id": "req_7"})
    failure = anthropic_messages.classify(
        anthropic.InternalServerError("Error code: 529", response=response, body=body)
    )
    assert failure.kind is ErrorKind.PROVIDER_5XX
    assert failure.message == "anthropic: HTTP 529: Overloaded (request req_7)"


# An error event in the middle of a stream that began 200, and the kind it is: as the same
# error would be before the stream, and the server's failure when the stream does not say.
OPENAI_STREAM_ERRORS = [
    ({"message": "boom", "type": "server_error", "param": None, "code": None}, "provider_5xx"),
    ({"message": "slow", "type": "requests", "code": "rate_limit_exceeded"}, "rate_limit"),
    ({"message": "credit", "type": "insufficient_quota", "code": "insufficient_quota"},
     "provider_4xx"),
    ({"message": "bad", "type": "invalid_request_error", "code": None}, "provider_4xx"),
    ({"message": "what?", "type": "something_new"}, "provider_5xx"),
    ({"message": "?"}, "provider_5xx"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "kind"), OPENAI_STREAM_ERRORS)
def test_openai_error_event_in_a_stream_is_classified_by_code_or_type(
    body: dict[str, Any], kind: str
) -> None:
    # What the SDK raises for a `data: {"error": {...}}` line.
    err = openai.APIError(body["message"], _response(200).request, body=body)
    failure = openai_compat.classify(err, request_id="req_5")
    assert failure.kind is ErrorKind(kind)
    assert failure.retry_after_s is None
    assert failure.message.startswith("openai: ")
    assert failure.message.endswith(f" in the stream: {body['message']} (request req_5)")


@pytest.mark.parametrize(
    ("error_type", "kind"),
    [
        ("overloaded_error", "provider_5xx"),
        ("api_error", "provider_5xx"),
        ("timeout_error", "provider_5xx"),
        ("rate_limit_error", "rate_limit"),
        ("invalid_request_error", "provider_4xx"),
        ("authentication_error", "auth"),
        ("something_new", "provider_5xx"),
    ],
)
def test_anthropic_error_event_in_a_stream_is_classified_by_type(
    error_type: str, kind: str
) -> None:
    body = {"type": "error", "error": {"type": error_type, "message": "Overloaded"}}
    response = _response(200, {"request-id": "req_8"})
    # What the SDK raises for an `event: error` in a 200 stream.
    err = anthropic.APIStatusError("stream error", response=response, body=body)
    failure = anthropic_messages.classify(err)
    assert failure.kind is ErrorKind(kind)
    assert failure.message == f"anthropic: {error_type} in the stream: Overloaded (request req_8)"


@pytest.mark.parametrize(
    "data",
    [
        [1, 2],
        "text",
        {"choices": "none"},
        {"choices": [{"index": 0, "delta": "hi"}]},
        {"choices": [{"delta": {"content": 7}}]},
        {"usage": {"completion_tokens": "many"}},
    ],
)
def test_openai_chunk_of_the_wrong_shape_is_a_parse_failure(data: object) -> None:
    with pytest.raises(AdapterError) as caught:
        read_event("openai", openai_compat.ChatCompletionChunk, data, "chat completion chunk")
    assert caught.value.kind is ErrorKind.PARSE
    assert "a stream event is not a chat completion chunk" in caught.value.message


@pytest.mark.parametrize(
    "data",
    [
        [1, 2],
        {"text": "no type"},
        {"type": "message_start"},
        {"type": "content_block_delta", "delta": {"text": "no type"}},
        {"type": "message_delta", "delta": None},
    ],
)
def test_anthropic_event_of_the_wrong_shape_is_a_parse_failure(data: object) -> None:
    with pytest.raises(AdapterError) as caught:
        anthropic_messages.read_stream_event("anthropic", data, StreamedAnswer(), StreamedOutput())
    assert caught.value.kind is ErrorKind.PARSE
    assert caught.value.message.startswith("anthropic: a stream event is not a")


def test_events_a_stream_may_add_later_are_passed_over() -> None:
    output, answer = StreamedOutput(), StreamedAnswer()
    for data in [
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use"}},
        {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": "{"}},
        {"type": "something_new", "delta": 3},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
    ]:
        anthropic_messages.read_stream_event("anthropic", data, answer, output)
    assert (output.text, answer.finished) == ("hi", False)


def _registry(**values: Any) -> Any:
    settings = Settings(
        **{"openai_api_key": "k", "anthropic_api_key": "k", "fake_adapter": True, **values},  # type: ignore[arg-type]
    )
    return build_adapters(settings)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"provider": "nope"}, "unknown provider 'nope'; use one of: anthropic, fake, openai"),
        ({"provider": "openai", "temprature": 0.2}, "options.temprature: Extra inputs"),
        ({"provider": "openai", "temperature": 3}, "options.temperature: Input should be less"),
        ({"provider": "openai", "max_tokens": 0}, "options.max_tokens: Input should be greater"),
        ({"provider": "openai", "model": ""}, "options.model: String should have at least"),
        ({"provider": "openai", "fake": {}}, "options.fake: only the fake provider takes it"),
        ({"provider": "anthropic", "temperature": 0.5}, "takes no temperature"),
        ({"fake": {"fail": ["boom"]}}, "options.fake.fail.0: Input should be"),
        ({"provider": "fake", "temprature": 0.2}, "options.temprature: Extra inputs"),
    ],
)
def test_invalid_provider_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptions, match=message.replace("(", r"\(")):
        _registry().validate(options)


@pytest.mark.parametrize(
    ("provider", "variable"),
    [("openai", "PROMPTJOBS_OPENAI_API_KEY"), ("anthropic", "PROMPTJOBS_ANTHROPIC_API_KEY")],
)
def test_provider_without_credential_is_refused_with_the_variable_to_set(
    provider: str, variable: str
) -> None:
    registry = _registry(openai_api_key=None, anthropic_api_key=None)
    with pytest.raises(InvalidOptions, match=f"set {variable}"):
        registry.validate({"provider": provider})


def test_full_provider_options_are_accepted() -> None:
    registry = _registry()
    registry.validate(
        {"provider": "openai", "model": "m", "max_tokens": 5, "temperature": 0.2, "system": "s"}
    )
    registry.validate({"provider": "anthropic", "model": "m", "max_tokens": 5, "system": "s"})
    registry.validate({"fake": {"latency_ms": 1}, "model": "m", "temperature": 0.2})
