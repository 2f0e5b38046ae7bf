"""Each provider adapter, through its real SDK over real HTTP against the mock provider: what a
scripted answer becomes (an AttemptResult or an AdapterError of which kind)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from activities.adapters.base import AdapterRequest
from activities.errors import AdapterError
from projections.lifecycle import AttemptResult, ErrorKind
from promptjobs.runtime import build_adapters
from tests.conftest import MockProviderServer, free_port, provider_settings

PROVIDERS = ["openai", "anthropic"]


async def complete(
    tmp_path: Path,
    mock: MockProviderServer,
    provider: str,
    prompt: str,
    options: dict[str, Any] | None = None,
    **settings: Any,
) -> AttemptResult:
    registry = build_adapters(provider_settings(tmp_path, mock, **settings))
    options = {"provider": provider, **(options or {})}
    request = AdapterRequest("job_test", "pmt_test", prompt, attempt=1, options=options)
    return await registry.get(options).complete(request)


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
    assert seen | {"attempt": 1} == {
        "api": "openai",
        "model": "gpt-test",
        "prompt": prompt,
        "system": "Be brief",
        "max_tokens": 3,
        "temperature": 0.3,
        "attempt": 1,
        "step": "ok",
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
    assert result.finish_reason == "max_tokens"
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
