"""Jobs on the real providers' SDKs, end to end: HTTP API, dispatcher, Temporal dev server,
worker, and the mock provider over real HTTP scripting each failure the adapters classify."""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.adapters.base import AdapterRequest, StreamedOutput
from activities.adapters.options import PromptOptions
from projections.models import JobEvent
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import build_adapters
from promptjobs.settings import Settings
from tests.conftest import (
    MockProviderServer,
    Stack,
    eventually,
    free_port,
    make_settings,
    parse_time,
    provider_settings,
    running_stack,
)

ALICE = Scope("acme", "alice", "member")
PROVIDERS = ["openai", "anthropic"]


async def events(stack: Stack, job_id: str) -> list[JobEvent]:
    return await stack.projection.store.job_events(ALICE, job_id)


async def run_job(
    stack: Stack, provider: str, model: str, max_attempts: int = 3
) -> tuple[str, dict[str, Any], list[JobEvent]]:
    prompt = f"end to end {uuid.uuid4().hex}"
    accepted = await stack.submit(
        prompt, max_attempts=max_attempts, options={"provider": provider, "model": model}
    )
    job = await stack.settled(accepted["job_id"], timeout=30)
    return prompt, job, await events(stack, accepted["job_id"])


Q, R, S, F = "queued", "running", "succeeded", "failed"

# The mock's script, the job's attempts, the states its events show, the error kind of each
# failed attempt, and the job's final error kind. Rate limits have their own tests below.
JOURNEYS = [
    pytest.param("mock:fail=500,503", 3, [Q, R, Q, R, Q, R, S], ["provider_5xx"] * 2, None,
                 id="500-503"),
    pytest.param("mock:fail=reset", 3, [Q, R, Q, R, S], ["provider_5xx"], None,
                 id="connection-reset"),
    pytest.param("mock:fail=500,500", 2, [Q, R, Q, R, F], ["provider_5xx"], "provider_5xx",
                 id="5xx-exhausted"),
    pytest.param("mock:fail=401", 3, [Q, R, F], [], "auth", id="401"),
    pytest.param("mock:fail=403", 3, [Q, R, F], [], "auth", id="403"),
    pytest.param("mock:fail=400", 3, [Q, R, F], [], "provider_4xx", id="400"),
    pytest.param("mock:fail=malformed", 3, [Q, R, F], [], "parse", id="malformed"),
]  # fmt: skip


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("model", "attempts", "states", "retried", "final_kind"), JOURNEYS)
async def test_provider_failure_end_to_end(
    provider_stack: Stack,
    mock_provider: MockProviderServer,
    provider: str,
    model: str,
    attempts: int,
    states: list[str],
    retried: list[str],
    final_kind: str | None,
) -> None:
    prompt, job, log = await run_job(provider_stack, provider, model, attempts)

    assert [e.state.value for e in log] == states
    assert [e.data["error_kind"] for e in log if e.state.value == Q][1:] == retried
    assert job["state"] == states[-1]
    assert job["error_kind"] == final_kind
    assert job["attempt"] == states.count(R)
    if final_kind is not None:
        assert job["error_message"].startswith(f"{provider}: ")
    else:
        answer = (await provider_stack.http.get(f"/v1/responses/{job['response_id']}")).json()
        assert answer["provider"] == provider
        assert answer["attempt"] == job["attempt"]
    # One provider request per attempt: Temporal retries, the SDKs do not.
    assert len(await mock_provider.requests(prompt)) == job["attempt"]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("model", "wait_s"),
    [("mock:fail=429;retry_after=2", 2.0), ("mock:fail=429;retry_after_ms=1500", 1.5)],
)
async def test_rate_limited_attempt_waits_as_long_as_the_provider_says(
    provider_stack: Stack,
    mock_provider: MockProviderServer,
    provider: str,
    model: str,
    wait_s: float,
) -> None:
    prompt, job, log = await run_job(provider_stack, provider, model)
    assert [e.state.value for e in log] == [Q, R, Q, R, S]
    assert (job["state"], job["attempt"], job["error_kind"]) == (S, 2, None)
    assert len(await mock_provider.requests(prompt)) == 2
    requeued, retried = log[2], log[3]
    assert requeued.state.value == Q and requeued.data["error_kind"] == "rate_limit"
    next_attempt_at = parse_time(requeued.data["next_attempt_at"])
    # next_attempt_at is the failure's time plus the provider's wait.
    waited = (next_attempt_at - requeued.created_at).total_seconds()
    assert wait_s - 0.25 <= waited <= wait_s + 0.25
    # And Temporal did not start the next attempt before it.
    assert retried.created_at >= next_attempt_at - timedelta(milliseconds=100)


async def test_429_without_retry_after_waits_the_configured_default(
    provider_stack: Stack,
) -> None:
    _prompt, job, log = await run_job(provider_stack, "openai", "mock:fail=429")
    assert job["state"] == S
    requeued = log[2]
    waited = (parse_time(requeued.data["next_attempt_at"]) - requeued.created_at).total_seconds()
    # provider_settings sets rate_limit_default_s = 1.
    assert 0.75 <= waited <= 1.25


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_hanging_provider_times_out_and_the_job_retries(
    dev_server: WorkflowEnvironment,
    mock_provider: MockProviderServer,
    tmp_path: Path,
    provider: str,
) -> None:
    settings = provider_settings(tmp_path, mock_provider, provider_timeout_s=1.0)
    async with running_stack(settings, dev_server.client) as stack:
        _prompt, _job, log = await run_job(stack, provider, "mock:fail=hang")
    assert [e.state.value for e in log] == [Q, R, Q, R, S]
    assert log[2].data["error_kind"] == "timeout"
    assert log[2].data["error_message"] == f"{provider}: no answer within 1 s"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_response_records_what_the_provider_answered(
    provider_stack: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    prompt = f"Write one short line {uuid.uuid4().hex}"
    options: dict[str, Any] = {
        "provider": provider,
        "model": f"{provider}-test-model",
        "max_tokens": 64,
        "system": "Be brief",
    }
    if provider == "openai":
        options["temperature"] = 0.2
    job = await provider_stack.settled(
        (await provider_stack.submit(prompt, options=options))["job_id"]
    )
    assert job["state"] == S

    answer = (await provider_stack.http.get(f"/v1/responses/{job['response_id']}")).json()
    assert prompt in answer["text"]
    assert answer["provider"] == provider
    assert answer["model"] == f"{provider}-test-model"
    assert answer["provider_request_id"].startswith("req_mock_")
    # Anthropic's `end_turn`, in the words every adapter uses.
    assert answer["finish_reason"] == "stop"
    # The mock counts words: the prompt's and the system's in, its reply's out.
    # The provider's own counts (from its stream); the model has no price: cost unknown.
    assert answer["usage"] == {
        "input_tokens": 7,
        "output_tokens": 6,
        "usage_estimated": False,
        "cost_usd": None,
    }
    assert 0 <= answer["first_token_ms"] <= answer["latency_ms"]
    assert (job["input_tokens"], job["output_tokens"], job["cost_usd"]) == (7, 6, None)

    [seen] = await mock_provider.requests(prompt)
    assert (seen["system"], seen["max_tokens"], seen["temperature"]) == (
        "Be brief",
        64,
        options.get("temperature"),
    )


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_retry_never_gets_the_previous_jobs_answer_when_the_provider_repeats_ids(
    provider_stack: Stack, provider: str
) -> None:
    # Ollama's /v1 answers chatcmpl-<0..998> and no request-id header: ids repeat.
    prompt = f"Which model answers? mock:request_id=chatcmpl-7 {uuid.uuid4().hex}"
    first = await provider_stack.submit(prompt, options={"provider": provider, "model": "model-a"})
    job_a = await provider_stack.settled(first["job_id"])
    retried = await provider_stack.http.post(
        f"/v1/jobs/{first['job_id']}/retry",
        json={"options": {"provider": provider, "model": "model-b"}},
    )
    assert retried.status_code == 202, retried.text
    job_b = await provider_stack.settled(retried.json()["job_id"])

    assert (job_a["state"], job_b["state"]) == (S, S)
    assert job_a["response_id"] != job_b["response_id"]
    answers = [
        (await provider_stack.http.get(f"/v1/responses/{job['response_id']}")).json()
        for job in (job_a, job_b)
    ]
    assert [(a["job_id"], a["model"]) for a in answers] == [
        (job_a["job_id"], "model-a"),
        (job_b["job_id"], "model-b"),
    ]
    # Both answers carry the repeated id: it is recorded, not trusted to be unique.
    assert {a["provider_request_id"] for a in answers} == {"chatcmpl-7"}


async def test_admin_script_fails_the_next_requests_whatever_the_prompt(
    provider_stack: Stack, mock_provider: MockProviderServer
) -> None:
    await mock_provider.script(fail=[503])
    _prompt, _job, log = await run_job(provider_stack, "openai", "plain-model")
    assert [e.state.value for e in log] == [Q, R, Q, R, S]
    assert log[2].data["error_kind"] == "provider_5xx"
    assert "scripted HTTP 503" in log[2].data["error_message"]


@pytest.mark.parametrize(
    ("options", "detail"),
    [
        ({"provider": "nope"}, "unknown provider 'nope'; use one of: anthropic, fake, openai"),
        ({"provider": "openai", "temprature": 0.2}, "options.temprature: unknown field"),
        ({"provider": "openai", "temperature": 9}, "options.temperature: Input should be less"),
        ({"provider": "anthropic", "temperature": 0.2}, "takes no temperature"),
    ],
)
async def test_unrunnable_options_are_refused_at_submission(
    provider_stack: Stack, options: dict[str, Any], detail: str
) -> None:
    response = await provider_stack.http.post(
        "/v1/prompts", json={"prompt": "hi", "options": options}
    )
    assert response.status_code == 422
    problem = response.json()
    # The request schema refuses what it describes (code `validation`); the provider's own
    # rules (credentials, per-provider fields) answer `invalid_options`.
    assert problem["code"] in {"validation", "invalid_options"}
    assert detail in problem["detail"]


async def test_provider_without_credential_is_refused_at_submission(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, openai_api_key=None, anthropic_api_key=None)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        for provider in PROVIDERS:
            response = await stack.http.post(
                "/v1/prompts", json={"prompt": "hi", "options": {"provider": provider}}
            )
            assert response.status_code == 422
            assert f"set PROMPTJOBS_{provider.upper()}_API_KEY" in response.json()["detail"]
        # The fake provider, where it is on (dev, tests), still needs nothing.
        assert (await stack.http.post("/v1/prompts", json={"prompt": "hi"})).status_code == 202


async def test_the_fake_provider_is_off_unless_configured(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    """As `promptjobs api` / `worker` start by default: no member can hold worker slots with
    `options.fake` (an hour of latency, `stuck` attempts), and no job falls back to it."""
    assert Settings(_env_file=None).fake_adapter is False  # type: ignore[call-arg]
    settings = make_settings(tmp_path, fake_adapter=False)
    async with running_stack(settings, dev_server.client) as stack:
        hold = {"fake": {"fail": ["stuck"]}, "provider": "fake"}
        response = await stack.http.post(
            "/v1/prompts", json={"prompt": "hold a slot", "options": hold, "max_attempts": 10}
        )
        assert response.status_code == 422
        assert response.json()["code"] == "invalid_options"
        assert "the fake provider is off" in response.json()["detail"]
        assert "PROMPTJOBS_FAKE_ADAPTER=true" in response.json()["detail"]
        # Naming no provider falls back to a real one, here without its key: refused too.
        response = await stack.http.post("/v1/prompts", json={"prompt": "hi"})
        assert response.status_code == 422
        assert "set PROMPTJOBS_OPENAI_API_KEY" in response.json()["detail"]

        # A fake job accepted where it was on (another API's configuration) never runs on a
        # worker that has it off: it fails at once, unretried, saying why.
        scope = Scope("acme", "alice", "member")
        options = {"provider": "fake", "fake": {"latency_ms": 3_600_000}}
        accepted = await stack.projection.store.submit(
            scope, Submission("elsewhere", 50, 5, options)
        )
        job = await stack.settled(accepted.job.job_id, timeout=20)
        assert (job["state"], job["error_kind"], job["attempt"]) == ("failed", "provider_4xx", 1)
        assert "the fake provider is off" in job["error_message"]


async def test_mock_provider_command_serves_until_terminated(tmp_path: Path) -> None:
    port = free_port()
    command = Path(sys.executable).parent / "promptjobs"
    process = await asyncio.create_subprocess_exec(
        str(command), "mock-provider", "--port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        async def up() -> bool:
            if process.returncode is not None:
                _out, err = await process.communicate()
                raise AssertionError(f"mock-provider exited: {err.decode()[-2000:]}")
            try:
                async with httpx.AsyncClient(base_url=url) as http:
                    return (await http.get("/mock/requests")).status_code == 200
            except httpx.TransportError:
                return False

        # Generous: a loaded machine takes long to import the CLI.
        await eventually(up, bool, timeout=90)
        settings = make_settings(
            tmp_path, openai_base_url=f"{url}/v1", openai_api_key="mock", provider_timeout_s=5
        )
        adapter = build_adapters(settings).get(PromptOptions(provider="openai"))
        result = await adapter.complete(
            AdapterRequest("job_cli", "pmt_cli", "ping", 1), StreamedOutput()
        )
        assert result.text.endswith(" ping")
    finally:
        process.terminate()
        stdout, _stderr = await process.communicate()
    assert process.returncode == 0
    assert f"PROMPTJOBS_OPENAI_BASE_URL={url}/v1" in stdout.decode()
