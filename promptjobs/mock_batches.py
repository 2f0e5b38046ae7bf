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
# How a line's result comes broken (its prompt's script asks): cut short with its custom_id
# still readable, cut short before it, a success without an answer, or the line twice.
BrokenLine = Literal["garbled", "anonymous", "empty", "twice"]


@dataclass(frozen=True)
class LineAnswer:
    """A line's request as the provider would answer it directly, and how its result line
    comes broken, if its script says so."""

    status: int
    body: dict[str, Any]
    broken: BrokenLine | None = None


AnswerLine = Callable[[Api, dict[str, Any], str], LineAnswer]
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
    fail_after_create: int = Field(
        default=0,
        ge=0,
        description="The next N batches created are kept and then answered with a 500, as a "
        "provider's answer lost on its way back",
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
    # custom_id → its answer, for the lines that ran.
    results: dict[str, LineAnswer] = field(default_factory=dict)
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

    def page(self, api: Api, limit: int, after: str | None) -> tuple[list[MockBatch], bool]:
        """A page of this API's batches, newest first, after the batch `after`; and whether
        more follow. Each is run first if its time has come."""
        mine = [batch for batch in self.batches.values() if batch.api == api]
        mine.sort(key=lambda batch: batch.created_at, reverse=True)
        ids = [batch.batch_id for batch in mine]
        start = ids.index(after) + 1 if after in ids else 0
        page = mine[start : start + max(1, min(limit, 1000))]
        return [self.advance(batch) for batch in page], start + len(page) < len(mine)

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
            answer = batch.results[custom_id]
            body = {"id": "chatcmpl-mock-empty"} if answer.broken == "empty" else answer.body
            row = {
                "id": f"batch_req_{uuid.uuid4().hex[:16]}",
                "custom_id": custom_id,
                "response": {
                    "status_code": answer.status,
                    "request_id": f"req_mock_{uuid.uuid4().hex[:16]}",
                    "body": body,
                },
                "error": None,
            }
            (output if answer.status == 200 else errors).extend(_rendered(row, answer.broken))
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
    done = sum(1 for answer in batch.results.values() if answer.status == 200)
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
    succeeded = sum(1 for answer in batch.results.values() if answer.status == 200)
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
        answer = batch.results.get(custom_id)
        if answer is None:
            result = {"type": "canceled" if batch.cancelled_at is not None else "expired"}
        elif answer.status != 200:
            result = {"type": "errored", "error": answer.body}
        elif answer.broken == "empty":
            result = {"type": "succeeded", "message": {"content": "not a list of blocks"}}
        else:
            result = {"type": "succeeded", "message": answer.body}
        broken = answer.broken if answer is not None else None
        rows.extend(_rendered({"custom_id": custom_id, "result": result}, broken))
    return ("\n".join(rows) + "\n").encode()


def _rendered(row: dict[str, Any], broken: BrokenLine | None) -> list[str]:
    """A result line as JSONL, broken as its script asks."""
    whole = json.dumps(row)
    if broken == "garbled":
        # Cut short after its custom_id: not JSON, but the job it answers can be told.
        return [json.dumps({"custom_id": row["custom_id"]})[:-1] + ', "respo']
    if broken == "anonymous":
        return ['{"id": "batch_req_cut", "respo']
    if broken == "twice":
        return [whole, whole]
    return [whole]


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
        return lost_answer("openai", openai_batch(batch))

    def lost_answer(api: Api, made: dict[str, Any]) -> dict[str, Any] | Response:
        """The batch is kept; its answer is lost on the way, if the behaviour says so."""
        if batches.behaviour.fail_after_create <= 0:
            return made
        batches.behaviour.fail_after_create -= 1
        error = {"message": "mock provider: answer lost after the batch was made"}
        if api == "anthropic":
            error = {"type": "api_error", **error}
        body: dict[str, Any] = {"error": error} | ({"type": "error"} if api == "anthropic" else {})
        return JSONResponse(body, status_code=500)

    @app.get("/v1/batches", tags=["openai batches"], response_model=None)
    async def list_openai(limit: int = 20, after: str | None = None) -> dict[str, Any] | Response:
        """The newest batches first, a page at a time (`after` the last id of the page before)."""
        if not batches.behaviour.supported:
            return not_found("openai", "route")
        data, more = batches.page("openai", limit, after)
        return {
            "object": "list",
            "data": [openai_batch(batch) for batch in data],
            "first_id": data[0].batch_id if data else None,
            "last_id": data[-1].batch_id if data else None,
            "has_more": more,
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

    @app.post("/v1/messages/batches", tags=["anthropic batches"], response_model=None)
    async def create_anthropic(request: Request) -> dict[str, Any] | Response:
        body = await request.json()
        lines = [
            {"custom_id": item["custom_id"], "body": item["params"]}
            for item in body.get("requests", [])
        ]
        made = anthropic_batch(batches.create("anthropic", lines), _base(request))
        return lost_answer("anthropic", made)

    @app.get("/v1/messages/batches", tags=["anthropic batches"])
    async def list_anthropic(
        request: Request, limit: int = 20, after_id: str | None = None
    ) -> dict[str, Any]:
        """The newest message batches first, a page at a time."""
        data, more = batches.page("anthropic", limit, after_id)
        return {
            "data": [anthropic_batch(batch, _base(request)) for batch in data],
            "has_more": more,
            "first_id": data[0].batch_id if data else None,
            "last_id": data[-1].batch_id if data else None,
        }

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
