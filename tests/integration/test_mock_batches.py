"""The mock provider speaks OpenAI's Batch API and Anthropic's Message Batches as the real
`openai` and `anthropic` SDKs call them, in seconds: per-line scripted failures, expiry and
cancellation (issue 33's ground to test provider batches on)."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from activities.adapters.batch import BATCH_TAG, batch_api_of
from activities.adapters.options import PromptOptions
from promptjobs.runtime import build_adapters
from tests.conftest import MockProviderServer, eventually, provider_settings


def chat(custom_id: str, prompt: str) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-test", "messages": [{"role": "user", "content": prompt}]},
    }


async def behave(mock: MockProviderServer, **behaviour: Any) -> None:
    (await mock.http.put("/mock/batches", json=behaviour)).raise_for_status()


def openai(mock: MockProviderServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=mock.openai_base_url, api_key="mock-key", max_retries=0)


async def openai_batch(client: AsyncOpenAI, lines: list[dict[str, Any]]) -> Any:
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    return await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


async def test_an_openai_batch_runs_each_line_as_its_script_says(
    mock_provider: MockProviderServer,
) -> None:
    await behave(mock_provider, run_s=0.3)
    client = openai(mock_provider)
    tag = uuid.uuid4().hex[:8]
    prompts = [f"fine {tag}", f"busy {tag} mock:fail=429", f"broken {tag} mock:fail=500"]
    batch = await openai_batch(client, [chat(f"c{i}", p) for i, p in enumerate(prompts)])
    assert batch.status == "in_progress"
    done = await eventually(
        lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed", timeout=10
    )
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    assert done.output_file_id and done.error_file_id
    [ok] = [
        json.loads(x) for x in (await client.files.content(done.output_file_id)).text.splitlines()
    ]
    assert ok["custom_id"] == "c0"
    assert ok["response"]["body"]["choices"][0]["message"]["content"].endswith(prompts[0])
    failed = {
        json.loads(line)["custom_id"]: json.loads(line)["response"]["status_code"]
        for line in (await client.files.content(done.error_file_id)).text.splitlines()
    }
    assert failed == {"c1": 429, "c2": 500}
    # The lines reached the mock inside the batch, not as direct calls.
    seen = [r for r in await mock_provider.requests() if tag in r["prompt"]]
    assert {r["batch"] for r in seen} == {batch.id}
    # A line's script counts its prompt's requests, as a direct call's does: sent again (in
    # the next batch), the 429 line succeeds.
    again = await openai_batch(client, [chat("retry", prompts[1])])
    redone = await eventually(
        lambda: client.batches.retrieve(again.id), lambda b: b.status == "completed", timeout=10
    )
    assert redone.request_counts is not None and redone.request_counts.completed == 1


async def test_an_openai_batch_expires_or_is_cancelled(mock_provider: MockProviderServer) -> None:
    client = openai(mock_provider)
    tag = uuid.uuid4().hex[:8]
    await behave(mock_provider, run_s=0.2, expire_after=2)
    expiring = await openai_batch(client, [chat(f"e{i}", f"{tag} {i}") for i in range(5)])
    expired = await eventually(
        lambda: client.batches.retrieve(expiring.id), lambda b: b.status != "in_progress"
    )
    assert expired.status == "expired"
    assert expired.request_counts is not None and expired.request_counts.completed == 2

    await behave(mock_provider, run_s=60)
    running = await openai_batch(client, [chat("x", f"{tag} never")])
    cancelled = await client.batches.cancel(running.id)
    assert cancelled.status == "cancelled"
    assert cancelled.output_file_id is None
    assert not [r for r in await mock_provider.requests() if r["prompt"] == f"{tag} never"]


async def test_anthropic_message_batches_through_its_sdk(mock_provider: MockProviderServer) -> None:
    await behave(mock_provider, run_s=0.3)
    client = AsyncAnthropic(base_url=mock_provider.anthropic_base_url, api_key="mock-key")
    tag = uuid.uuid4().hex[:8]

    def request(custom_id: str, prompt: str) -> Any:
        return {
            "custom_id": custom_id,
            "params": {
                "model": "claude-test",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": prompt}],
            },
        }

    batch = await client.messages.batches.create(
        requests=[request("a", f"hello {tag}"), request("b", f"bad {tag} mock:fail=400")]
    )
    assert batch.processing_status == "in_progress"
    ended = await eventually(
        lambda: client.messages.batches.retrieve(batch.id),
        lambda b: b.processing_status == "ended",
        timeout=10,
    )
    assert (ended.request_counts.succeeded, ended.request_counts.errored) == (1, 1)
    results = {r.custom_id: r.result async for r in await client.messages.batches.results(batch.id)}
    assert results["a"].type == "succeeded"
    assert results["a"].message.content[0].text.endswith(f"hello {tag}")  # type: ignore[union-attr]
    assert results["b"].type == "errored"

    await behave(mock_provider, run_s=60)
    slow = await client.messages.batches.create(requests=[request("c", f"slow {tag}")])
    await client.messages.batches.cancel(slow.id)
    over = await client.messages.batches.retrieve(slow.id)
    assert over.processing_status == "ended" and over.request_counts.canceled == 1
    [(custom_id, result)] = [
        (r.custom_id, r.result) async for r in await client.messages.batches.results(slow.id)
    ]
    assert (custom_id, result.type) == ("c", "canceled")
    await behave(mock_provider)


async def test_a_tagged_openai_batch_is_found_behind_more_than_a_page_of_newer_ones(
    mock_provider: MockProviderServer, tmp_path: Path
) -> None:
    # The adapter's `find` pages back to the send's start: 120 newer batches do not hide it.
    registry = build_adapters(provider_settings(tmp_path, mock_provider))
    api = batch_api_of(registry.get(PromptOptions(provider="openai")))
    assert api is not None
    client = openai(mock_provider)
    tag = f"pbatch_{uuid.uuid4().hex}"
    began = datetime.now(UTC)
    content = (json.dumps(chat("c0", "tagged")) + "\n").encode()
    uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    ours = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={BATCH_TAG: tag},
    )
    for i in range(120):
        await openai_batch(client, [chat("c0", f"newer {i}")])
    assert await api.find(tag, began, 1) == [ours.id]
    assert await api.find(f"pbatch_{uuid.uuid4().hex}", began, 1) == []
