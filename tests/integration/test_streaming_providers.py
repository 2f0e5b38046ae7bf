"""Live output, usage, cost and cancellation end to end through the real SDKs, against the mock
provider streaming in each API's format: a stream cut midway is retried with a reset, every
attempt is priced from the operator's price file, and a cancel closes the provider's stream."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from projections.domain.lifecycle import EventType
from projections.scope import Scope
from tests.conftest import (
    MockProviderServer,
    Stack,
    eventually,
    provider_settings,
    running_stack,
)

PROVIDERS = ["openai", "anthropic"]
ALICE = Scope("acme", "alice", "member")

PRICES = """
# USD per million tokens
[models."mock:*"]
input = 1.5
output = 6.0
"""


@pytest.fixture(scope="module")
async def priced_stack(
    dev_server: WorkflowEnvironment,
    mock_provider: MockProviderServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    where = tmp_path_factory.mktemp("priced")
    prices = where / "prices.toml"
    prices.write_text(PRICES)
    settings = provider_settings(where, mock_provider, prices_file=prices)
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


def cost(input_tokens: int, output_tokens: int) -> float:
    return (input_tokens * 1.5 + output_tokens * 6.0) / 1e6


async def attempts(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    body = (await stack.http.get(f"/v1/jobs/{job_id}/attempts")).json()
    found: list[dict[str, Any]] = body["attempts"]
    return found


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_cut_midway_is_retried_from_a_reset_and_every_attempt_is_priced(
    priced_stack: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    stack = priced_stack
    prompt = f"tell me about streams {uuid.uuid4().hex}"
    model = "mock:chunk_ms=20;fail=reset@3"
    job = await stack.submit(prompt, options={"provider": provider, "model": model})
    row = await stack.settled(job["job_id"])
    assert row["state"] == "succeeded" and row["attempt"] == 2

    log = await stack.projection.store.job_events(ALICE, job["job_id"], kinds=tuple(EventType))
    reset = next(i for i, e in enumerate(log) if e.type == EventType.OUTPUT_RESET)
    before = "".join(e.data["text"] for e in log[:reset] if e.type == EventType.OUTPUT)
    after = "".join(e.data["text"] for e in log[reset:] if e.type == EventType.OUTPUT)
    whole = await mock_provider.answer(prompt, "chunk_ms=20")
    assert before == " ".join(whole.split()[:3]) or whole.startswith(before)
    assert len(before.split()) == 3
    answer = (await stack.http.get(f"/v1/responses/{row['response_id']}")).json()
    assert after == answer["text"] == whole

    first, second = await attempts(stack, job["job_id"])
    assert (first["outcome"], second["outcome"]) == ("provider_5xx", "succeeded")
    assert first["output_chars"] == len(before) and first["usage_estimated"] is True
    assert second["usage_estimated"] is False
    assert second["output_tokens"] == len(whole.split())  # the provider's count
    for attempt in (first, second):
        assert attempt["model"] == model and attempt["provider"] == provider
        assert attempt["cost_usd"] == pytest.approx(
            cost(attempt["input_tokens"], attempt["output_tokens"])
        )
        assert attempt["first_token_ms"] is not None
    assert row["cost_usd"] == pytest.approx(first["cost_usd"] + second["cost_usd"])
    assert row["output_tokens"] == first["output_tokens"] + second["output_tokens"]
    assert answer["usage"]["cost_usd"] == pytest.approx(second["cost_usd"])


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_cancelling_a_running_job_closes_the_provider_stream(
    priced_stack: Stack, mock_provider: MockProviderServer, provider: str
) -> None:
    stack = priced_stack
    prompt = f"a very long answer {uuid.uuid4().hex}"
    # Thirty seconds of stream, a word every 100 ms.
    model = "mock:chunk_ms=100;chunks=300"
    job = await stack.submit(prompt, options={"provider": provider, "model": model})
    url = f"/v1/jobs/{job['job_id']}/output"
    await eventually(lambda: stack.http.get(url), lambda r: len(r.json()["text"]) > 0)

    asked = time.time()
    assert (await stack.http.post(f"/v1/jobs/{job['job_id']}/cancel")).status_code == 202
    [seen] = await eventually(
        lambda: mock_provider.requests(prompt),
        lambda seen: len(seen) == 1 and seen[0]["disconnected_at"] is not None,
    )
    # The stream was closed by us, long before its thirty seconds were up.
    assert seen["disconnected_at"] - asked < 5.0
    assert seen["chunks"] < 250
    row = await stack.settled(job["job_id"])
    assert row["state"] == "cancelled"

    # What it streamed and consumed before the cut stays, and is priced.
    final = await eventually(lambda: stack.http.get(url), lambda r: r.json()["done"])
    kept = final.json()["text"]
    whole = await mock_provider.answer(prompt, "chunks=300")
    assert kept and whole.startswith(kept) and len(kept.split()) <= seen["chunks"]
    [attempt] = await attempts(stack, job["job_id"])
    assert attempt["outcome"] == "cancelled"
    assert attempt["output_chars"] == len(kept)
    assert attempt["cost_usd"] == pytest.approx(
        cost(attempt["input_tokens"], attempt["output_tokens"])
    )
    row = await eventually(
        lambda: stack.job(job["job_id"]), lambda r: r["output_tokens"] == attempt["output_tokens"]
    )
    assert row["cost_usd"] == pytest.approx(attempt["cost_usd"])


async def test_an_unpriced_model_costs_unknown_not_zero(
    priced_stack: Stack, mock_provider: MockProviderServer
) -> None:
    job = await priced_stack.submit(
        f"free? {uuid.uuid4().hex}", options={"provider": "openai", "model": "no-price-model"}
    )
    row = await priced_stack.settled(job["job_id"])
    assert row["state"] == "succeeded"
    assert row["output_tokens"] > 0 and row["cost_usd"] is None
    [attempt] = await attempts(priced_stack, job["job_id"])
    assert attempt["cost_usd"] is None


def test_a_broken_price_file_is_one_readable_line(tmp_path: Path) -> None:
    from activities.prices import InvalidPrices, PriceTable

    bad = tmp_path / "prices.toml"
    bad.write_text('[models."gpt-4o*"]\ninput = "cheap"\noutput = 1\n')
    with pytest.raises(InvalidPrices, match=r"models\.gpt-4o\*\.input"):
        PriceTable.load(bad)
    bad.write_text("[models\n")
    with pytest.raises(InvalidPrices, match="not TOML"):
        PriceTable.load(bad)
    with pytest.raises(InvalidPrices, match="cannot read"):
        PriceTable.load(tmp_path / "missing.toml")
