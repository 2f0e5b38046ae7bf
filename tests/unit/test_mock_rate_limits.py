"""The mock provider in rate-limit mode (issue 31, item 7): a sliding minute of requests and
tokens, 429 with `retry-after` past it, and both APIs' rate-limit headers on every answer, read
here through the official SDKs as a worker reads them."""

from __future__ import annotations

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from promptjobs.mock_provider import (
    Limits,
    MockProvider,
    SlidingMinute,
    create_mock_app,
    openai_duration,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_sliding_minute_lets_n_requests_through_and_says_when_the_next_one_fits() -> None:
    clock = Clock()
    minute = SlidingMinute(Limits(rpm=3), clock)
    for second in (0, 10, 20):
        clock.now = 1000.0 + second
        assert minute.admit(1, 1).allowed
    clock.now = 1030.0
    refused = minute.admit(1, 1)
    assert not refused.allowed
    # The first request leaves the window 60 s after it came, 30 s from now.
    assert refused.retry_after_s == pytest.approx(30.0)
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    clock.now = 1060.0
    assert minute.admit(1, 1).allowed  # the window slid past the first one
    assert (minute.requests, minute.rate_limited) == (5, 1)


def test_tokens_count_input_and_output_and_a_request_larger_than_the_limit_never_fits() -> None:
    clock = Clock()
    minute = SlidingMinute(Limits(tpm=100), clock)
    assert minute.admit(30, 30).allowed
    clock.now += 5
    assert minute.admit(20, 10).allowed
    clock.now += 5
    refused = minute.admit(10, 20)  # 60 + 30 + 30 > 100
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(50.0)  # when the first 60 tokens leave
    assert refused.headers["x-ratelimit-remaining-tokens"] == "10"
    assert refused.headers["anthropic-ratelimit-input-tokens-remaining"] == "50"
    assert refused.headers["anthropic-ratelimit-output-tokens-remaining"] == "60"
    assert minute.admit(101, 0).retry_after_s == 60.0


def test_openai_durations() -> None:
    assert openai_duration(0.0195) == "20ms"
    assert openai_duration(1.5) == "1.5s"
    assert openai_duration(60.0) == "1m0s"
    assert openai_duration(59.25) == "59.25s"


def limited_app(limits: Limits) -> TestClient:
    return TestClient(create_mock_app(MockProvider(limits)))


def test_the_openai_sdk_reads_the_headers_and_a_429_with_retry_after() -> None:
    http = limited_app(Limits(rpm=2, tpm=1000))
    client = openai.OpenAI(
        base_url="http://testserver/v1", api_key="mock", http_client=http, max_retries=0
    )
    answered = client.chat.completions.with_raw_response.create(
        model="gpt-test", messages=[{"role": "user", "content": "one two three"}]
    )
    headers = answered.headers
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "1"
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    # Three words in, four out (the mock's digest word and the prompt's three).
    assert headers["x-ratelimit-remaining-tokens"] == str(1000 - 7)
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert answered.parse().usage.total_tokens == 7  # type: ignore[union-attr]
    stream = client.chat.completions.with_raw_response.create(
        model="gpt-test", messages=[{"role": "user", "content": "again"}], stream=True
    )
    assert stream.headers["x-ratelimit-remaining-requests"] == "0"
    assert "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "a third"}]
        )
    assert 0 < int(refused.value.response.headers["retry-after"]) <= 60
    assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    seen = http.get("/mock/limits").json()
    assert (seen["requests"], seen["rate_limited"], seen["window"]["requests"]) == (3, 1, 2)
    logged = http.get("/mock/requests").json()["requests"]
    assert [entry["rate_limited"] for entry in logged] == [False, False, True]


def test_the_anthropic_sdk_reads_its_headers_and_limits_can_change_at_run_time() -> None:
    http = limited_app(Limits())
    client = anthropic.Anthropic(
        base_url="http://testserver", api_key="mock", http_client=http, max_retries=0
    )
    message = [{"role": "user", "content": "hello there"}]
    unlimited = client.messages.with_raw_response.create(
        model="claude-test",
        max_tokens=50,
        messages=message,  # type: ignore[arg-type]
    )
    assert not any(h.startswith("anthropic-ratelimit") for h in unlimited.headers)
    assert http.put("/mock/limits", json={"rpm": 1, "tpm": 500}).status_code == 200
    answered = client.messages.with_raw_response.create(
        model="claude-test",
        max_tokens=50,
        messages=message,  # type: ignore[arg-type]
    )
    headers = answered.headers
    assert headers["anthropic-ratelimit-requests-limit"] == "1"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-tokens-remaining"] == str(500 - 5)
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == str(500 - 2)
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(
            model="claude-test",
            max_tokens=50,
            messages=message,  # type: ignore[arg-type]
        )
    assert 0 < int(refused.value.response.headers["retry-after"]) <= 60
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert http.put("/mock/limits", json={"rpm": 0}).status_code == 422
