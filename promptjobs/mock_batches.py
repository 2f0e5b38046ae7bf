"""The mock provider's batch APIs: OpenAI's Files and Batch API and Anthropic's Message
Batches, as their SDKs call them, on a time scale of seconds.

A batch runs `run_s` after it is created (checked when it is read: no background task), each
of its lines answered as the same request would be answered directly (its prompt's script:
`mock:fail=429` makes the line a 429, and counts as one of that prompt's requests, so a retry
of the line succeeds). `expire_after` lines later, a batch expires instead: the rest are left
unrun. Set both for the batches created next with `PUT /mock/batches`."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import FastAPI, File, Form, Request, Response, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

Api = Literal["openai", "anthropic"]
# A line's request as the provider would answer it directly: (HTTP status, body).
AnswerLine = Callable[[Api, dict[str, Any], str], tuple[int, dict[str, Any]]]
DAY_S = 24 * 3600


class BatchBehaviour(BaseModel):
    """How the batches created from now on run."""

    model_config = ConfigDict(extra="forbid")

    run_s: float = Field(default=1.0, ge=0, le=86_400, description="Seconds until a batch ends")
    expire_after: int | None = Field(
        default=None, ge=0, description="Lines a batch runs before it expires (null: all)"
    )
    supported: bool = Field(
        default=True,
        description="false: the batch APIs answer 404, as a compatible server without them",
    )


@dataclass
class MockBatch:
    api: Api
    batch_id: str
    lines: list[dict[str, Any]]  # {custom_id, body}
    created_at: float
    run_s: float
    expire_after: int | None
    endpoint: str = "/v1/chat/completions"
    input_file_id: str | None = None
    metadata: dict[str, Any] | None = None
    cancelled_at: float | None = None
    ended_at: float | None = None
    expired: bool = False
    # custom_id → (status, body), for the lines that ran.
    results: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None


class MockBatches:
    def __init__(self, answer_line: AnswerLine) -> None:
        self.answer_line = answer_line
        self.behaviour = BatchBehaviour()
        self.files: dict[str, tuple[str, str, bytes]] = {}  # id → (purpose, filename, content)
        self.batches: dict[str, MockBatch] = {}

    def reset(self) -> None:
        self.behaviour = BatchBehaviour()
        self.files.clear()
        self.batches.clear()

    def create(self, api: Api, lines: list[dict[str, Any]], **more: Any) -> MockBatch:
        prefix = "batch_mock_" if api == "openai" else "msgbatch_mock_"
        batch = MockBatch(
            api=api,
            batch_id=prefix + uuid.uuid4().hex[:20],
            lines=lines,
            created_at=time.time(),
            run_s=self.behaviour.run_s,
            expire_after=self.behaviour.expire_after,
            **more,
        )
        self.batches[batch.batch_id] = batch
        return batch

    def find(self, api: Api, batch_id: str) -> MockBatch | None:
        """The batch of this API's, if there is one by that id."""
        batch = self.batches.get(batch_id)
        return batch if batch is not None and batch.api == api else None

    def advance(self, batch: MockBatch) -> MockBatch:
        """Run the batch if its time has come (and it was not cancelled)."""
        now = time.time()
        if batch.ended_at is not None or now < batch.created_at + batch.run_s:
            return batch
        runs = batch.lines if batch.expire_after is None else batch.lines[: batch.expire_after]
        for line in runs:
            batch.results[line["custom_id"]] = self.answer_line(
                batch.api, line["body"], batch.batch_id
            )
        batch.expired = len(runs) < len(batch.lines)
        batch.ended_at = now
        if batch.api == "openai":
            self._write_files(batch)
        return batch

    def cancel(self, batch: MockBatch) -> MockBatch:
        self.advance(batch)
        if batch.ended_at is None:
            batch.cancelled_at = batch.ended_at = time.time()
        return batch

    def _write_files(self, batch: MockBatch) -> None:
        output: list[str] = []
        errors: list[str] = []
        for line in batch.lines:
            custom_id = line["custom_id"]
            if custom_id not in batch.results:
                continue
            status, body = batch.results[custom_id]
            row = {
                "id": f"batch_req_{uuid.uuid4().hex[:16]}",
                "custom_id": custom_id,
                "response": {
                    "status_code": status,
                    "request_id": f"req_mock_{uuid.uuid4().hex[:16]}",
                    "body": body,
                },
                "error": None,
            }
            (output if status == 200 else errors).append(json.dumps(row))
        for rows, attribute in ((output, "output_file_id"), (errors, "error_file_id")):
            if rows:
                file_id = self._store("batch_output", f"{batch.batch_id}.jsonl", rows)
                setattr(batch, attribute, file_id)

    def _store(self, purpose: str, filename: str, rows: list[str]) -> str:
        file_id = f"file-mock-{uuid.uuid4().hex[:20]}"
        self.files[file_id] = (purpose, filename, ("\n".join(rows) + "\n").encode())
        return file_id


def openai_batch(batch: MockBatch) -> dict[str, Any]:
    if batch.cancelled_at is not None:
        status = "cancelled"
    elif batch.ended_at is None:
        status = "in_progress"
    else:
        status = "expired" if batch.expired else "completed"
    done = sum(1 for status_code, _ in batch.results.values() if status_code == 200)
    ended = int(batch.ended_at) if batch.ended_at is not None else None
    return {
        "id": batch.batch_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": None,
        "input_file_id": batch.input_file_id,
        "completion_window": "24h",
        "status": status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": int(batch.created_at),
        "expires_at": int(batch.created_at + DAY_S),
        "finalizing_at": ended if status == "completed" else None,
        "completed_at": ended if status == "completed" else None,
        "failed_at": None,
        "expired_at": ended if status == "expired" else None,
        "cancelling_at": int(batch.cancelled_at) if batch.cancelled_at else None,
        "cancelled_at": int(batch.cancelled_at) if batch.cancelled_at else None,
        "request_counts": {
            "total": len(batch.lines),
            "completed": done,
            "failed": len(batch.results) - done,
        },
        "metadata": batch.metadata,
    }


def anthropic_batch(batch: MockBatch, base_url: str) -> dict[str, Any]:
    ended = batch.ended_at is not None
    succeeded = sum(1 for status, _ in batch.results.values() if status == 200)
    unrun = len(batch.lines) - len(batch.results)
    return {
        "id": batch.batch_id,
        "type": "message_batch",
        "processing_status": "ended" if ended else "in_progress",
        "request_counts": {
            "processing": 0 if ended else len(batch.lines),
            "succeeded": succeeded,
            "errored": len(batch.results) - succeeded,
            "canceled": unrun if batch.cancelled_at is not None else 0,
            "expired": unrun if batch.expired else 0,
        },
        "ended_at": _iso(batch.ended_at),
        "created_at": _iso(batch.created_at),
        "expires_at": _iso(batch.created_at + DAY_S),
        "archived_at": None,
        "cancel_initiated_at": _iso(batch.cancelled_at),
        "results_url": f"{base_url}/v1/messages/batches/{batch.batch_id}/results"
        if ended
        else None,
    }


def anthropic_results(batch: MockBatch) -> bytes:
    rows = []
    for line in batch.lines:
        custom_id = line["custom_id"]
        result: dict[str, Any]
        if custom_id in batch.results:
            status, body = batch.results[custom_id]
            result = (
                {"type": "succeeded", "message": body}
                if status == 200
                else {"type": "errored", "error": body}
            )
        else:
            result = {"type": "canceled" if batch.cancelled_at is not None else "expired"}
        rows.append(json.dumps({"custom_id": custom_id, "result": result}))
    return ("\n".join(rows) + "\n").encode()


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def add_batch_routes(app: FastAPI, batches: MockBatches) -> None:
    def not_found(api: Api, what: str) -> Response:
        if api == "openai":
            body: dict[str, Any] = {
                "error": {"message": f"no {what}", "type": "invalid_request_error"}
            }
        else:
            body = {"type": "error", "error": {"type": "not_found_error", "message": f"no {what}"}}
        return JSONResponse(body, status_code=404)

    @app.post("/v1/files", tags=["openai batches"])
    async def upload(
        file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]
    ) -> dict[str, Any]:
        content = await file.read()
        file_id = f"file-mock-{uuid.uuid4().hex[:20]}"
        batches.files[file_id] = (purpose, file.filename or "upload.jsonl", content)
        return _file(file_id, batches.files[file_id])

    @app.get("/v1/files/{file_id}", tags=["openai batches"], response_model=None)
    async def read_file(file_id: str) -> dict[str, Any] | Response:
        stored = batches.files.get(file_id)
        return not_found("openai", "file") if stored is None else _file(file_id, stored)

    @app.get("/v1/files/{file_id}/content", tags=["openai batches"])
    async def file_content(file_id: str) -> Response:
        stored = batches.files.get(file_id)
        if stored is None:
            return not_found("openai", "file")
        return Response(stored[2], media_type="application/octet-stream")

    @app.post("/v1/batches", tags=["openai batches"], response_model=None)
    async def create_openai(request: Request) -> dict[str, Any] | Response:
        if not batches.behaviour.supported:
            return not_found("openai", "route")
        body = await request.json()
        stored = batches.files.get(str(body.get("input_file_id")))
        if stored is None:
            return not_found("openai", "input file")
        lines = [json.loads(raw) for raw in stored[2].decode().splitlines() if raw.strip()]
        batch = batches.create(
            "openai",
            [{"custom_id": line["custom_id"], "body": line["body"]} for line in lines],
            endpoint=str(body.get("endpoint")),
            input_file_id=str(body.get("input_file_id")),
            metadata=body.get("metadata"),
        )
        return openai_batch(batch)

    @app.get("/v1/batches", tags=["openai batches"], response_model=None)
    async def list_openai(limit: int = 20) -> dict[str, Any] | Response:
        """The newest batches first (one page: enough for finding a batch by metadata)."""
        if not batches.behaviour.supported:
            return not_found("openai", "route")
        mine = [batch for batch in batches.batches.values() if batch.api == "openai"]
        mine.sort(key=lambda batch: batch.created_at, reverse=True)
        data = [openai_batch(batches.advance(batch)) for batch in mine[: max(1, limit)]]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(mine) > limit,
        }

    @app.get("/v1/batches/{batch_id}", tags=["openai batches"], response_model=None)
    async def read_openai(batch_id: str) -> dict[str, Any] | Response:
        batch = batches.find("openai", batch_id)
        if batch is None:
            return not_found("openai", "batch")
        return openai_batch(batches.advance(batch))

    @app.post("/v1/batches/{batch_id}/cancel", tags=["openai batches"], response_model=None)
    async def cancel_openai(batch_id: str) -> dict[str, Any] | Response:
        batch = batches.find("openai", batch_id)
        if batch is None:
            return not_found("openai", "batch")
        return openai_batch(batches.cancel(batch))

    @app.post("/v1/messages/batches", tags=["anthropic batches"])
    async def create_anthropic(request: Request) -> dict[str, Any]:
        body = await request.json()
        lines = [
            {"custom_id": item["custom_id"], "body": item["params"]}
            for item in body.get("requests", [])
        ]
        return anthropic_batch(batches.create("anthropic", lines), _base(request))

    @app.get("/v1/messages/batches/{batch_id}", tags=["anthropic batches"], response_model=None)
    async def read_anthropic(batch_id: str, request: Request) -> dict[str, Any] | Response:
        batch = batches.find("anthropic", batch_id)
        if batch is None:
            return not_found("anthropic", "message batch")
        return anthropic_batch(batches.advance(batch), _base(request))

    @app.post(
        "/v1/messages/batches/{batch_id}/cancel", tags=["anthropic batches"], response_model=None
    )
    async def cancel_anthropic(batch_id: str, request: Request) -> dict[str, Any] | Response:
        batch = batches.find("anthropic", batch_id)
        if batch is None:
            return not_found("anthropic", "message batch")
        return anthropic_batch(batches.cancel(batch), _base(request))

    @app.get("/v1/messages/batches/{batch_id}/results", tags=["anthropic batches"])
    async def anthropic_results_of(batch_id: str) -> Response:
        batch = batches.find("anthropic", batch_id)
        if batch is None or batch.ended_at is None:
            return not_found("anthropic", "results")
        return Response(anthropic_results(batch), media_type="application/x-jsonl")

    @app.put("/mock/batches", tags=["admin"])
    async def set_behaviour(behaviour: BatchBehaviour) -> BatchBehaviour:
        """How the batches created from now on run."""
        batches.behaviour = behaviour
        return behaviour


def _file(file_id: str, stored: tuple[str, str, bytes]) -> dict[str, Any]:
    purpose, filename, content = stored
    return {
        "id": file_id,
        "object": "file",
        "bytes": len(content),
        "created_at": int(time.time()),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
    }


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")
