"""Each provider adapter, through its real SDK over real HTTP against the mock provider: what a
scripted answer becomes (an AttemptResult or an AdapterError of which kind), and what it
streamed on the way."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from activities.adapters.base import AdapterRequest, StreamedOutput
from activities.adapters.options import PromptOptions
from activities.errors import AdapterError
from projections.domain.lifecycle import AttemptResult, ErrorKind
from promptjobs.runtime import build_adapters
from tests.conftest import MockProviderServer, eventually, free_port, provider_settings

PROVIDERS = ["openai", "anthropic"]


async def complete(
    tmp_path: Path,
    mock: MockProviderServer,
    provider: str,
    prompt: str,
    options: dict[str, Any] | None = None,
    output: StreamedOutput | None = None,
    **settings: Any,
) -> AttemptResult:
    registry = build_adapters(provider_settings(tmp_path, mock, **settings))
    # Parsed, not checked: the adapter's own call is what these tests try.
    parsed = PromptOptions.model_validate({"provider": provider, **(options or {})})
    request = AdapterRequest("job_test", "pmt_test", prompt, attempt=1, options=parsed)
    return await registry.get(parsed).complete(request, output or StreamedOutput())


def recorded() -> tuple[StreamedOutput, list[str]]:
    """An output that keeps each delta as it came."""
    deltas: list[str] = []

    def keep() -> None:
        deltas.append(output.since(sum(map(len, deltas))))

    output = StreamedOutput(keep)
    return output, deltas


async def failure(
    tmp_path: Path, mock: MockProviderServer, provider: str, model: str, **settings: Any
) -> AdapterError:
    prompt = f"classify {uuid.uuid4().hex}"
    with pytest.raises(AdapterError) as caught:
        await complete(tmp_path, mock, provider, prompt, {"model": model}, **settings)
    # One request per call: the SDK's own retries are off.
    assert len(await mock.requests(prompt)) == 1
    return caught.value


# Every failure the mock can script, and what each provider's adapter makes of it.
FAILURES = [
    ("mock:fail=429;retry_after=2", ErrorKind.RATE_LIMIT, 2.0),
    ("mock:fail=429;retry_after=0.5", ErrorKind.RATE_LIMIT, 0.5),
    ("mock:fail=429;retry_after_ms=1500", ErrorKind.RATE_LIMIT, 1.5),
    ("mock:fail=429;retry_after=9;retry_after_ms=250", ErrorKind.RATE_LIMIT, 0.25),
    ("mock:fail=429", ErrorKind.RATE_LIMIT, None),
    ("mock:fail=500", ErrorKind.PROVIDER_5XX, None),
    ("mock:fail=502", ErrorKind.PROVIDER_5XX, None),
    ("mock:fail=503", ErrorKind.PROVIDER_5XX, None),
    ("mock:fail=529", ErrorKind.PROVIDER_5XX, None),
    ("mock:fail=reset", ErrorKind.PROVIDER_5XX, None),
    ("mock:fail=hang", ErrorKind.TIMEOUT, None),
    ("mock:fail=408", ErrorKind.TIMEOUT, None),
    ("mock:fail=401", ErrorKind.AUTH, None),
    ("mock:fail=403", ErrorKind.AUTH, None),
    ("mock:fail=400", ErrorKind.PROVIDER_4XX, None),
    ("mock:fail=404", ErrorKind.PROVIDER_4XX, None),
    ("mock:fail=422", ErrorKind.PROVIDER_4XX, None),
    ("mock:fail=malformed", ErrorKind.PARSE, None),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("model", "kind", "retry_after"), FAILURES)
async def test_scripted_failure_is_classified(
    tmp_path: Path,
    mock_provider: MockProviderServer,
    provider: str,
    model: str,
    kind: ErrorKind,
    retry_after: float | None,
) -> None:
    timeout_s = 1.0 if model.endswith("hang") else 5.0
    err = await failure(tmp_path, mock_provider, provider, model, provider_timeout_s=timeout_s)
    assert err.kind is kind
    assert err.retry_after_s == retry_after
    assert err.message.startswith(f"{provider}: ")
    if model.removeprefix("mock:fail=")[:1].isdigit():
        assert "HTTP " in err.message and "(request req_mock_" in err.message


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_unreachable_provider_is_a_5xx(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(AdapterError) as caught:
        await complete(
            tmp_path,
            mock_provider,
            provider,
            "anyone there?",
            openai_base_url=f"{closed}/v1",
            anthropic_base_url=closed,
        )
    assert caught.value.kind is ErrorKind.PROVIDER_5XX
    # The SDK's own words ("Connection error.", or since anthropic 2.17 the address and the
    # errno), after the provider's name.
    assert caught.value.message.startswith(f"{provider}: ")
    assert "connect" in caught.value.message.lower()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_missing_credential_at_call_time_is_auth(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    with pytest.raises(AdapterError) as caught:
        await complete(
            tmp_path, mock_provider, provider, "hi", openai_api_key=None, anthropic_api_key=None
        )
    assert caught.value.kind is ErrorKind.AUTH
    assert f"PROMPTJOBS_{provider.upper()}_API_KEY" in caught.value.message


async def test_openai_result_records_what_the_provider_answered(
    tmp_path: Path, mock_provider: MockProviderServer
) -> None:
    prompt = f"one two three four five {uuid.uuid4().hex}"
    options = {"model": "gpt-test", "max_tokens": 3, "temperature": 0.3, "system": "Be brief"}
    result = await complete(tmp_path, mock_provider, "openai", prompt, options)
    assert result.provider == "openai"
    assert result.model == "gpt-test"
    assert result.text.startswith("[mock:") and result.text.endswith("] one two")
    assert result.finish_reason == "length"
    assert result.provider_request_id and result.provider_request_id.startswith("req_mock_")
    assert (result.input_tokens, result.output_tokens) == (8, 3)
    assert result.latency_ms is not None and result.latency_ms >= 0
    [seen] = await mock_provider.requests(prompt)
    assert seen.pop("first_chunk_at") is not None
    assert seen | {"attempt": 1} == {
        "api": "openai",
        "model": "gpt-test",
        "prompt": prompt,
        "system": "Be brief",
        "max_tokens": 3,
        "temperature": 0.3,
        "tools": [],
        "after_tool": False,
        "images": [],
        "answer_schema": None,
        "attempt": 1,
        "step": "ok",
        "stream": True,
        "chunks": 3,
        "disconnected_at": None,
        "rate_limited": False,
        "batch": None,
    }


async def test_openai_defaults_come_from_settings(
    tmp_path: Path, mock_provider: MockProviderServer
) -> None:
    prompt = f"defaults {uuid.uuid4().hex}"
    result = await complete(
        tmp_path,
        mock_provider,
        "openai",
        prompt,
        openai_model="house-model",
        openai_max_tokens=50,
        openai_max_tokens_field="max_tokens",
    )
    assert result.model == "house-model"
    assert result.finish_reason == "stop"
    [seen] = await mock_provider.requests(prompt)
    assert (seen["model"], seen["max_tokens"], seen["temperature"]) == ("house-model", 50, None)


async def test_anthropic_result_records_what_the_provider_answered(
    tmp_path: Path, mock_provider: MockProviderServer
) -> None:
    prompt = f"one two three four five {uuid.uuid4().hex}"
    options = {"model": "claude-test", "max_tokens": 3, "system": "Be brief"}
    result = await complete(tmp_path, mock_provider, "anthropic", prompt, options)
    assert result.provider == "anthropic"
    assert result.model == "claude-test"
    assert result.text.endswith(" one two")
    # Anthropic's `max_tokens` stop, in the words every adapter uses.
    assert result.finish_reason == "length"
    assert result.provider_request_id and result.provider_request_id.startswith("req_mock_")
    assert (result.input_tokens, result.output_tokens) == (8, 3)
    [seen] = await mock_provider.requests(prompt)
    assert (seen["api"], seen["system"], seen["max_tokens"]) == ("anthropic", "Be brief", 3)


async def test_anthropic_max_tokens_defaults_from_settings(
    tmp_path: Path, mock_provider: MockProviderServer
) -> None:
    prompt = f"defaults {uuid.uuid4().hex}"
    await complete(tmp_path, mock_provider, "anthropic", prompt, anthropic_max_tokens=77)
    [seen] = await mock_provider.requests(prompt)
    assert (seen["model"], seen["max_tokens"]) == ("claude-haiku-4-5", 77)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_directive_in_the_prompt_counts_attempts_per_prompt(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    prompt = f"mock:fail=503,401 counted {uuid.uuid4().hex}"
    kinds = []
    for _ in range(2):
        with pytest.raises(AdapterError) as caught:
            await complete(tmp_path, mock_provider, provider, prompt)
        kinds.append(caught.value.kind)
    assert kinds == [ErrorKind.PROVIDER_5XX, ErrorKind.AUTH]
    result = await complete(tmp_path, mock_provider, provider, prompt)
    assert prompt in result.text
    assert [r["attempt"] for r in await mock_provider.requests(prompt)] == [1, 2, 3]


# -- streaming ---------------------------------------------------------------------------

FINISH = {"openai": "stop", "anthropic": "stop"}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_streamed_answer_arrives_in_order_and_whole(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    prompt = f"stream these words in order {uuid.uuid4().hex}"
    whole = await mock_provider.answer(prompt)
    output, deltas = recorded()
    result = await complete(
        tmp_path, mock_provider, provider, prompt, {"model": "stream-test"}, output
    )
    words = whole.split(" ")
    # A chunk a word, in order; together they are the answer, and the result is them.
    assert deltas == [words[0], *(f" {w}" for w in words[1:])]
    assert result.text == output.text == "".join(deltas) == whole
    assert (result.model, result.finish_reason) == ("stream-test", FINISH[provider])
    assert result.provider_request_id and result.provider_request_id.startswith("req_mock_")
    # The provider's own counts (the mock counts words), from the stream's usage.
    assert (result.input_tokens, result.output_tokens) == (len(prompt.split()), len(words))
    assert (output.input_tokens, output.output_tokens) == (result.input_tokens, len(words))
    [seen] = [r for r in await mock_provider.requests(prompt) if r["model"] == "stream-test"]
    assert (seen["stream"], seen["chunks"], seen["disconnected_at"]) == (True, len(words), None)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_long_paced_stream_is_read_to_its_end(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    prompt = f"short {uuid.uuid4().hex}"
    whole = await mock_provider.answer(prompt, "chunks=40")
    output, deltas = recorded()
    options = {"model": "mock:chunk_ms=5;chunks=40"}
    result = await complete(tmp_path, mock_provider, provider, prompt, options, output)
    assert len(deltas) == 40
    assert result.text == whole
    assert result.output_tokens == 40


# A failure after some chunks of a stream, the kind it is, and how many chunks came before it.
MID_STREAM = [
    pytest.param("reset@3", ErrorKind.PROVIDER_5XX, 3, id="reset"),
    pytest.param("500@3", ErrorKind.PROVIDER_5XX, 3, id="500-event"),
    # Anthropic's `overloaded_error`.
    pytest.param("529@2", ErrorKind.PROVIDER_5XX, 2, id="overloaded-event"),
    pytest.param("503@0", ErrorKind.PROVIDER_5XX, 0, id="5xx-event-first"),
    pytest.param("429@2", ErrorKind.RATE_LIMIT, 2, id="rate-limit-event"),
    pytest.param("400@1", ErrorKind.PROVIDER_4XX, 1, id="4xx-event"),
    pytest.param("truncate@3", ErrorKind.PROVIDER_5XX, 3, id="truncated"),
    pytest.param("truncate@9", ErrorKind.PROVIDER_5XX, 5, id="truncated-after-all-text"),
    pytest.param("malformed@2", ErrorKind.PARSE, 2, id="malformed-event"),
    pytest.param("hang@3", ErrorKind.TIMEOUT, 3, id="read-timeout"),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("step", "kind", "chunks"), MID_STREAM)
async def test_failure_mid_stream_is_classified_and_keeps_what_came(
    tmp_path: Path,
    mock_provider: MockProviderServer,
    provider: str,
    step: str,
    kind: ErrorKind,
    chunks: int,
) -> None:
    prompt = f"one two three {uuid.uuid4().hex}"
    words = (await mock_provider.answer(prompt)).split(" ")
    assert len(words) == 5
    output = StreamedOutput()
    with pytest.raises(AdapterError) as caught:
        await complete(
            tmp_path,
            mock_provider,
            provider,
            prompt,
            {"model": f"mock:fail={step}"},
            output,
            provider_timeout_s=1.0 if step.startswith("hang") else 5.0,
        )
    assert caught.value.kind is kind, caught.value.message
    assert caught.value.message.startswith(f"{provider}: ")
    assert caught.value.retry_after_s is None
    assert output.text == " ".join(words[:chunks])
    if step[0].isdigit():
        assert " in the stream: " in caught.value.message
        assert "(request req_mock_" in caught.value.message
    [seen] = [r for r in await mock_provider.requests(prompt) if r["step"] == step]
    assert (seen["stream"], seen["chunks"]) == (True, chunks)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_stream_cut_on_one_attempt_succeeds_on_the_next(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    prompt = f"mock:fail=reset@2 cut once {uuid.uuid4().hex}"
    first = StreamedOutput()
    with pytest.raises(AdapterError) as caught:
        await complete(tmp_path, mock_provider, provider, prompt, output=first)
    assert caught.value.kind is ErrorKind.PROVIDER_5XX
    assert first.deltas == 2
    result = await complete(tmp_path, mock_provider, provider, prompt)
    assert result.text.endswith(prompt)
    seen = await mock_provider.requests(prompt)
    assert [(r["attempt"], r["step"], r["chunks"]) for r in seen] == [
        (1, "reset@2", 2),
        (2, "ok", len(result.text.split())),
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_cancelling_the_call_closes_the_stream(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    # A 30 s stream: only the cancellation ends it early.
    prompt = f"mock:chunk_ms=100;chunks=300 cancel me {uuid.uuid4().hex}"
    output = StreamedOutput()
    call = asyncio.create_task(complete(tmp_path, mock_provider, provider, prompt, output=output))

    async def streamed() -> list[dict[str, Any]]:
        return await mock_provider.requests(prompt)

    # The mock's count moves while the stream runs.
    await eventually(streamed, lambda seen: bool(seen) and seen[0]["chunks"] >= 3, timeout=10)
    cancelled_at = time.time()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    [seen] = await eventually(
        streamed, lambda seen: seen[0]["disconnected_at"] is not None, timeout=5
    )
    assert seen["disconnected_at"] - cancelled_at < 1.0
    assert 3 <= seen["chunks"] < 300
    assert output.deltas <= seen["chunks"]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("step", "message"),
    [
        # A 200 whose body is JSON, as from a server that ignored `stream` or a proxy's page.
        ("malformed", "the answer is not an event stream (content-type application/json)"),
        ("malformed@0", "a stream event is not JSON"),
    ],
)
async def test_answer_not_understood_as_a_stream_is_a_parse_failure(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str, step: str, message: str
) -> None:
    err = await failure(tmp_path, mock_provider, provider, f"mock:fail={step}")
    assert err.kind is ErrorKind.PARSE
    assert message in err.message


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_mock_refuses_a_step_it_cannot_play(
    tmp_path: Path, mock_provider: MockProviderServer, provider: str
) -> None:
    with pytest.raises(AdapterError) as caught:
        await complete(tmp_path, mock_provider, provider, "hi", {"model": "mock:fail=ok@3"})
    assert caught.value.kind is ErrorKind.PROVIDER_4XX
    assert "cannot read this request" in caught.value.message
