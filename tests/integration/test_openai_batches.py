"""OpenAI's Files and Batch APIs through the unmodified `openai` SDK against the real stack:
upload, a batch of chat lines with scripted failures, its output read back, a batch
cancelled half way, invalid input reported per line, and tenancy."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from temporalio.testing import WorkflowEnvironment

from activities.adapters.fake import fake_output
from projections.scope import Scope
from tests.conftest import Stack, eventually, make_settings, running_stack


def sdk(stack: Stack, key: str | None = None) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key or stack.api_key, max_retries=0)


def chat_line(custom_id: str, text: str, **fake: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "fake/any",
            "messages": [
                {"role": "system", "content": "Be brief"},
                {"role": "user", "content": text},
            ],
            "max_tokens": 100,
            "promptjobs": {"max_attempts": 1, "options": {"fake": fake}} if fake else {},
        },
    }


def jsonl(lines: list[dict[str, Any]] | list[str]) -> bytes:
    return "".join(
        (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines
    ).encode()


async def upload(client: AsyncOpenAI, content: bytes) -> str:
    uploaded = await client.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch")
    assert uploaded.bytes == len(content)
    return uploaded.id


async def finished(client: AsyncOpenAI, batch_id: str, timeout: float = 120) -> Any:
    return await eventually(
        lambda: client.batches.retrieve(batch_id),
        lambda b: b.status in ("completed", "failed", "cancelled", "expired"),
        timeout=timeout,
    )


# 1,000 jobs: ~30 s alone, past two minutes beside the rest of the suite on two busy cores.
@pytest.mark.timeout(360)
async def test_a_batch_of_chat_lines_with_failures_and_its_output_files(stack: Stack) -> None:
    client = sdk(stack)
    lines = [
        chat_line(f"req-{i}", f"question {i}", fail=["auth"])
        if i % 10 == 3
        else chat_line(f"req-{i}", f"question {i}")
        for i in range(1000)
    ]
    file_id = await upload(client, jsonl(lines))
    # The file reads back as it was sent.
    assert (await client.files.content(file_id)).content == jsonl(lines)

    batch = await client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "nightly"},
    )
    assert batch.status == "validating"
    done = await finished(client, batch.id, timeout=300)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (
        done.request_counts.total,
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (
        1000,
        900,
        100,
    )
    assert done.metadata == {"run": "nightly"}
    assert done.output_file_id and done.error_file_id

    output = [
        json.loads(line)
        for line in (await client.files.content(done.output_file_id)).text.splitlines()
    ]
    assert len(output) == 900
    first = output[0]
    assert first["custom_id"] == "req-0"
    assert first["response"]["status_code"] == 200
    body = first["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == fake_output("question 0")
    assert body["usage"]["total_tokens"] > 0
    # Every line is an ordinary job, named by the line's request id.
    job = await stack.job(first["response"]["request_id"])
    assert job["state"] == "succeeded"
    prompt = (await stack.http.get(f"/v1/prompts/{job['prompt_id']}")).json()
    assert prompt["messages"][0] == {"role": "system", "content": "Be brief"}

    errors = [
        json.loads(line)
        for line in (await client.files.content(done.error_file_id)).text.splitlines()
    ]
    assert sorted(e["custom_id"] for e in errors) == sorted(f"req-{i}" for i in range(3, 1000, 10))
    assert errors[0]["response"]["status_code"] == 401
    assert errors[0]["response"]["body"]["error"]["message"].startswith("auth:")

    listed = [b.id async for b in client.batches.list()]
    assert batch.id in listed


async def test_invalid_lines_fail_the_batch_with_each_error(stack: Stack) -> None:
    client = sdk(stack)
    file_id = await upload(
        client,
        jsonl(
            [
                chat_line("a", "fine"),
                "{not json",
                chat_line("a", "the same custom_id"),
                {**chat_line("c", "x"), "url": "/v1/embeddings"},
                {**chat_line("d", "x"), "body": {"model": "fake/any", "messages": [], "tools": []}},
            ]
        ),
    )
    batch = await client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await finished(client, batch.id)
    assert done.status == "failed"
    assert done.errors is not None
    assert [(e.line, e.code) for e in done.errors.data or []] == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "mismatched_endpoint"),
        (5, "invalid_request"),
    ]
    # Nothing of a failed batch ran.
    assert done.request_counts is not None and done.request_counts.total == 0


async def test_a_batch_cancelled_half_way(stack: Stack) -> None:
    client = sdk(stack)
    lines = [chat_line(f"r{i}", f"q {i}", latency_ms=100 if i < 5 else 60_000) for i in range(20)]
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl(lines)),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    await eventually(
        lambda: client.batches.retrieve(batch.id),
        lambda b: b.request_counts is not None and b.request_counts.completed >= 5,
        timeout=60,
    )
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = await finished(client, batch.id, timeout=60)
    assert done.status == "cancelled"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (5, 15)
    assert done.output_file_id and done.error_file_id
    errors = (await client.files.content(done.error_file_id)).text.splitlines()
    assert {json.loads(e)["error"]["code"] for e in errors} == {"batch_cancelled"}
    # Cancelling again answers the batch as it is.
    assert (await client.batches.cancel(batch.id)).status == "cancelled"


async def test_responses_lines_answer_response_objects(stack: Stack) -> None:
    client = sdk(stack)
    line = {
        "custom_id": "only",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "fake/any", "input": "hello", "instructions": "Be brief"},
    }
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([line])),
        endpoint="/v1/responses",
        completion_window="24h",
    )
    done = await finished(client, batch.id)
    assert done.status == "completed" and done.output_file_id
    [out] = (await client.files.content(done.output_file_id)).text.splitlines()
    body = json.loads(out)["response"]["body"]
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == fake_output("hello")


async def test_files_and_batches_of_another_org_are_not_found(stack: Stack) -> None:
    client = sdk(stack)
    file_id = await upload(client, jsonl([chat_line("a", "mine")]))
    batch = await client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    stranger = sdk(stack, await stack.key("other-org", "eve", role="admin"))
    for call in (
        lambda: stranger.files.retrieve(file_id),
        lambda: stranger.files.content(file_id),
        lambda: stranger.files.delete(file_id),
        lambda: stranger.batches.retrieve(batch.id),
        lambda: stranger.batches.cancel(batch.id),
        lambda: stranger.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            await call()
    assert [f.id async for f in stranger.files.list()] == []
    assert [b.id async for b in stranger.batches.list()] == []
    # Bad requests are OpenAI's 400s.
    with pytest.raises(openai.BadRequestError) as bad:
        await client.batches.create(
            input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
        )
    assert bad.value.param == "endpoint"
    with pytest.raises(openai.BadRequestError):
        await client.files.create(file=("x.txt", io.BytesIO(b"x")), purpose="fine-tune")
    deleted = await client.files.delete(file_id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(file_id)


async def test_a_line_too_long_to_hold_is_reported_not_read(stack: Stack) -> None:
    """A hostile file of one 3 MB line is refused line by line: the reader never holds it."""
    client = sdk(stack)
    huge = '{"custom_id": "big", "body": "' + "x" * 3_000_000 + '"}'
    file_id = await upload(client, jsonl([huge, chat_line("ok", "fine")]))
    batch = await client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await finished(client, batch.id)
    assert done.status == "failed"
    assert done.errors is not None
    assert [(e.line, e.code) for e in done.errors.data or []] == [(1, "line_too_large")]


async def test_an_admin_may_batch_a_members_file(stack: Stack) -> None:
    member = sdk(stack)  # alice of acme
    admin = sdk(stack, await stack.key("acme", "carol", role="admin"))
    file_id = await upload(member, jsonl([chat_line("a", "from alice's file")]))
    batch = await admin.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await finished(admin, batch.id, timeout=60)
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == 1


async def test_a_batch_whose_input_file_was_deleted_fails_saying_so(stack: Stack) -> None:
    client = sdk(stack)
    file_id = await upload(client, jsonl([chat_line("a", "gone")]))
    await client.files.delete(file_id)
    # As if the file were deleted between the batch's creation and its first read.
    made = await stack.projection.store.batches.create(
        Scope("acme", "alice"),
        {
            "endpoint": "/v1/chat/completions",
            "input_file_id": file_id,
            "completion_window": "24h",
            "meta": None,
            "expires_at": datetime.now(UTC) + timedelta(hours=24),
        },
    )
    done = await finished(client, made.batch_id, timeout=30)
    assert done.status == "failed", done
    assert done.errors is not None and done.errors.data is not None
    [error] = done.errors.data
    assert error.code == "invalid_file" and file_id in (error.message or "")


async def test_an_input_file_past_the_line_cap_fails_its_batch_and_makes_no_job(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, batch_max_lines=3)
    async with running_stack(settings, dev_server.client) as stack:
        client = sdk(stack)
        file_id = await upload(client, jsonl([chat_line(f"l{i}", f"line {i}") for i in range(4)]))
        batch = await client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await finished(client, batch.id, timeout=30)
        jobs = (await stack.http.get("/v1/jobs")).json()["jobs"]
    assert done.status == "failed"
    assert done.errors is not None and done.errors.data is not None
    assert done.errors.data[0].code == "too_many_lines"
    assert jobs == []


async def test_an_upload_past_the_orgs_storage_quota_is_refused(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, org_max_file_bytes=1000)
    async with running_stack(settings, dev_server.client) as stack:
        client = sdk(stack)
        first = await upload(client, b"x" * 600)
        with pytest.raises(openai.APIStatusError) as refused:
            await client.files.create(file=("more.jsonl", io.BytesIO(b"y" * 600)), purpose="batch")
        assert refused.value.status_code == 413
        assert "PROMPTJOBS_ORG_MAX_FILE_BYTES" in str(refused.value)
        # Another org has its own quota; deleting frees the caller's.
        other = sdk(stack, await stack.key("globex", "bob"))
        await upload(other, b"z" * 600)
        await client.files.delete(first)
        await upload(client, b"y" * 600)
