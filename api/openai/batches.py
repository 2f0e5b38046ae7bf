"""OpenAI's Batch API over promptjobs jobs: each line of the input file becomes one prompt and
its job (in bulk transactions, the file read a chunk at a time), and the batch moves through
OpenAI's statuses as its jobs settle. `BatchRunner` does that work in every API process;
every step is guarded in the database, so processes sweeping at once, or one that died half
way, never accept a line twice nor lose one."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from activities.adapters.base import InvalidOptions
from api.openai.chat import ChatRequest, chat_completion
from api.openai.errors import error_type, param_of
from api.openai.responses import (
    CreateResponse,
    UnsupportedParameter,
    response_object,
    submission_of,
)
from projections.budgets import OverBudget
from projections.domain.errors import PromptTooLarge
from projections.domain.lifecycle import ErrorKind, JobState
from projections.errors import InvalidState, NotFound
from projections.event_log import utcnow
from projections.files import CHUNK_BYTES, new_file_id
from projections.models import Batch
from projections.openai_batches import Line, Outcome, timestamp
from projections.scope import Scope
from projections.store import JobStore
from projections.writes import Submission
from services.jobs import JobService

log = logging.getLogger("promptjobs.batches")

ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
WINDOWS = {"24h": timedelta(hours=24)}
# Lines accepted per transaction, and jobs cancelled or lines written out per read.
ACCEPT_BATCH = 500
PAGE = 500
# Lines parsed between two turns of other requests on the API's event loop.
YIELD_EVERY = 50
# Validation errors a failed batch reports (the count says how many there were).
MAX_ERRORS = 1000
# A batch left `finalizing` this long (its process died writing the files) is finalized again.
FINALIZE_STALE = timedelta(minutes=5)
# Bytes of a line: far more than a prompt of PROMPTJOBS_MAX_PROMPT_BYTES needs as JSON.
LINE_OVERHEAD = 64 * 1024


def batch_object(batch: Batch, counts: dict[JobState, int] | None = None) -> dict[str, Any]:
    """The `batch` object; `counts` (while it runs) are its jobs' states now."""
    if counts is None:
        completed, failed = batch.completed, batch.failed
    else:
        completed = counts.get(JobState.SUCCEEDED, 0)
        failed = counts.get(JobState.FAILED, 0) + counts.get(JobState.CANCELLED, 0)
    return {
        "id": batch.batch_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": timestamp(batch.created_at),
        "in_progress_at": timestamp(batch.in_progress_at),
        "expires_at": timestamp(batch.expires_at),
        "finalizing_at": timestamp(batch.finalizing_at),
        "completed_at": timestamp(batch.completed_at),
        "failed_at": timestamp(batch.failed_at),
        "expired_at": timestamp(batch.expired_at),
        "cancelling_at": timestamp(batch.cancelling_at),
        "cancelled_at": timestamp(batch.cancelled_at),
        "request_counts": {"total": batch.total, "completed": completed, "failed": failed},
        "metadata": batch.meta or {},
    }


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


class BatchRunner:
    def __init__(
        self,
        store: JobStore,
        jobs: JobService,
        *,
        max_prompt_bytes: int,
        max_lines: int = 50_000,
        interval_s: float = 1.0,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.max_prompt_bytes = max_prompt_bytes
        # An input file's lines at most (PROMPTJOBS_BATCH_MAX_LINES; OpenAI's is 50,000).
        self.max_lines = max_lines
        self.interval_s = interval_s
        self._wake = asyncio.Event()

    def kick(self) -> None:
        self._wake.set()

    async def run(self, *, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sweep()
            except Exception as err:
                log.warning("batch sweep failed, will retry: %r", err)
            self._wake.clear()
            waiting = [asyncio.create_task(stop.wait()), asyncio.create_task(self._wake.wait())]
            await asyncio.wait(waiting, timeout=self.interval_s, return_when="FIRST_COMPLETED")
            for task in waiting:
                task.cancel()

    async def sweep(self) -> None:
        for batch in await self.store.batches.active():
            try:
                await self.advance(batch)
            except Exception as err:
                log.warning("batch %s: %r, will retry", batch.batch_id, err)

    async def advance(self, batch: Batch) -> None:
        now = utcnow()
        if batch.status == "validating":
            await self._accept(batch)
        elif batch.status == "in_progress":
            if now >= batch.expires_at:
                await self.store.batches.move(
                    batch.batch_id, "cancelling", came_from=("in_progress",), expired_at=now
                )
                return
            counts = await self.store.batches.counts(batch.batch_id)
            settled = sum(n for state, n in counts.items() if state.is_terminal)
            if settled >= batch.total:
                await self._finalize(batch, "completed", came_from="in_progress")
        elif batch.status == "cancelling":
            if await self._cancel_some(batch) == 0:
                final = "expired" if batch.expired_at is not None else "cancelled"
                await self._finalize(batch, final, came_from="cancelling")
        elif batch.status == "finalizing":
            if batch.finalizing_at is not None and now - batch.finalizing_at > FINALIZE_STALE:
                final = (
                    "expired"
                    if batch.expired_at is not None
                    else "cancelled"
                    if batch.cancelling_at is not None
                    else "completed"
                )
                await self._finalize(batch, final, came_from="finalizing")

    # -- validating: read the file, then accept its lines ---------------------------------

    @property
    def max_line_bytes(self) -> int:
        return self.max_prompt_bytes * 6 + LINE_OVERHEAD

    def parse(self, raw: bytes | None, number: int, endpoint: str, seen: set[str]) -> Line:
        """Line `number` (from 0) of an input file as a Line, or a LineError as OpenAI says
        it (`seen`: the custom_ids before it; `raw` None: a line too long to read)."""
        if raw is None:
            raise LineError(
                "line_too_large",
                f"This line is over {self.max_line_bytes:,} bytes, more than the largest "
                "prompt needs.",
            )
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise LineError(
                "invalid_json_line", "This line is not parseable as valid JSON."
            ) from None
        if not isinstance(value, dict):
            raise LineError("invalid_request", "Each line must be a JSON object.")
        custom_id = value.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
            raise LineError(
                "missing_required_parameter",
                "custom_id must be a string of 1 to 512 characters.",
                "custom_id",
            )
        if custom_id in seen:
            raise LineError(
                "duplicate_custom_id",
                f"The custom_id {custom_id!r} is used by more than one line.",
                "custom_id",
            )
        if value.get("method") != "POST":
            raise LineError("invalid_method", "method must be POST.", "method")
        if value.get("url") != endpoint:
            raise LineError(
                "mismatched_endpoint",
                f"url must be the batch's endpoint, {endpoint}.",
                "url",
            )
        body = value.get("body")
        if not isinstance(body, dict):
            raise LineError("invalid_request", "body must be a JSON object.", "body")
        return Line(number, custom_id, self._submission(body, endpoint))

    def _submission(self, body: dict[str, Any], endpoint: str) -> Submission:
        try:
            if endpoint == "/v1/chat/completions":
                submission = ChatRequest.model_validate(body).submission(self.jobs.adapters)
            else:
                request = CreateResponse.model_validate(body)
                if request.background or request.stream:
                    raise UnsupportedParameter(
                        "background" if request.background else "stream",
                        "a batch line is neither background nor streamed: leave it out",
                    )
                submission = submission_of(request, self.jobs.adapters, in_batch=True)
            return self.jobs.check(submission)
        except ValidationError as err:
            first = err.errors()[0]
            param = param_of(("body", *first["loc"]))
            raise LineError("invalid_request", f"body.{param}: {first['msg']}", param) from err
        except UnsupportedParameter as err:
            raise LineError(err.code, err.message, err.param) from err
        except InvalidOptions as err:
            raise LineError("invalid_request", str(err), "promptjobs.options") from err
        except PromptTooLarge as err:
            raise LineError(err.code, err.worded("the input", "instructions"), "input") from err

    async def _accept(self, batch: Batch) -> None:
        try:
            await self._read_and_accept(batch)
        except NotFound as err:
            await self._input_gone(batch, err)

    async def _input_gone(self, batch: Batch, err: NotFound) -> None:
        """The input file was deleted before the batch had read it all: what was accepted
        runs (a job accepted is never dropped) and the batch says what was not read; with
        nothing accepted, it fails."""
        batch = await self.store.batches.row(batch.batch_id)
        error = {
            "code": "invalid_file",
            "message": f"The input file {err.ident} was deleted before the batch read it"
            + (
                f": {batch.accepted} of its {batch.total} lines were accepted and run; "
                "the rest were never read."
                if batch.accepted
                else "."
            ),
            "param": "input_file_id",
            "line": None,
        }
        log.warning("batch %s: %s", batch.batch_id, error["message"])
        if batch.accepted:
            await self.store.batches.move(
                batch.batch_id,
                "in_progress",
                came_from=("validating",),
                total=batch.accepted,
                errors=[error],
                in_progress_at=utcnow(),
            )
        else:
            await self.store.batches.move(
                batch.batch_id,
                "failed",
                came_from=("validating",),
                errors=[error],
                failed_at=utcnow(),
                total=0,
            )

    async def _read_and_accept(self, batch: Batch) -> None:
        scope = owner(batch)
        if batch.total == 0:
            total, errors = await self._validate(batch, scope)
            if errors or total == 0:
                errors = errors or [
                    {"code": "empty_file", "message": "The input file has no lines.", "line": None}
                ]
                await self.store.batches.move(
                    batch.batch_id,
                    "failed",
                    came_from=("validating",),
                    errors=errors[:MAX_ERRORS],
                    failed_at=utcnow(),
                    total=0,
                )
                return
            if not await self.store.batches.move(
                batch.batch_id, "validating", came_from=("validating",), total=total
            ):
                return
            batch = await self.store.batches.row(batch.batch_id)
        first, group = batch.accepted, []
        seen: set[str] = set()
        number = -1
        async for raw in self._lines(batch, scope):
            number += 1
            if number < batch.accepted:
                continue
            group.append(self.parse(raw, number, batch.endpoint, seen))
            if len(group) == ACCEPT_BATCH:
                if not await self._accepted(batch, first, group):
                    return
                first, group = first + len(group), []
        if group and not await self._accepted(batch, first, group):
            return
        await self.store.batches.move(
            batch.batch_id, "in_progress", came_from=("validating",), in_progress_at=utcnow()
        )

    async def _accepted(self, batch: Batch, first: int, group: list[Line]) -> bool:
        # Over a provider budget is refused at submission (the same check as POST
        # /v1/prompts); validation has passed every line, so this is a budget set meanwhile.
        for line in group:
            try:
                await self.jobs.check_budget(line.submission.text, line.submission.options)
            except OverBudget as err:
                log.warning("batch %s line %d: %s", batch.batch_id, line.line, err)
        return await self.store.batches.accept(batch, first, group)

    async def _validate(self, batch: Batch, scope: Scope) -> tuple[int, list[dict[str, Any]]]:
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        count = 0
        async for raw in self._lines(batch, scope):
            count += 1
            if count > self.max_lines:
                # Not read further: the batch fails, and no line of it becomes a job.
                errors.insert(
                    0,
                    {
                        "code": "too_many_lines",
                        "message": f"The input file has more than {self.max_lines:,} lines, "
                        "the most a batch may have (PROMPTJOBS_BATCH_MAX_LINES): split it.",
                        "param": "input_file_id",
                        "line": None,
                    },
                )
                break
            try:
                line = self.parse(raw, count - 1, batch.endpoint, seen)
                seen.add(line.custom_id)
            except LineError as err:
                if len(errors) < MAX_ERRORS:
                    errors.append(
                        {
                            "code": err.code,
                            "message": err.message,
                            "param": err.param,
                            "line": count,
                        }
                    )
        return count, errors

    async def _lines(self, batch: Batch, scope: Scope) -> AsyncIterator[bytes | None]:
        """The input file's non-empty lines (None: one too long to hold). Parsing them is the
        API's own event loop's work: it lets other requests in every YIELD_EVERY lines."""
        count = 0
        # The file is read as the org's: an admin may make a batch of a member's file (the
        # create checked that the caller sees it); the jobs are still the batch author's.
        org = Scope(scope.org, scope.user, "admin")
        lines = self.store.files.lines(org, batch.input_file_id, self.max_line_bytes)
        async for raw in lines:
            if raw is None or raw.strip():
                yield raw
                count += 1
                if count % YIELD_EVERY == 0:
                    await asyncio.sleep(0)

    # -- cancelling and finalizing --------------------------------------------------------

    async def _cancel_some(self, batch: Batch) -> int:
        """Ask up to PAGE of the batch's open jobs to cancel; how many were still open."""
        scope = owner(batch)
        jobs = await self.store.batches.open_jobs(batch.batch_id, PAGE)
        for job in jobs:
            try:
                await self.jobs.cancel(scope, job.job_id)
            except InvalidState:
                pass  # it settled meanwhile
        if jobs:
            return len(jobs)
        counts = await self.store.batches.counts(batch.batch_id)
        return sum(n for state, n in counts.items() if not state.is_terminal)

    async def _finalize(self, batch: Batch, final: str, *, came_from: str) -> None:
        now = utcnow()
        if not await self.store.batches.move(
            batch.batch_id, "finalizing", came_from=(came_from,), finalizing_at=now
        ):
            return
        scope = owner(batch)
        tally = {"completed": 0, "failed": 0}
        files = {}
        for name, succeeded in (("output", True), ("error", False)):
            file_id = new_file_id()
            written = await self.store.files.write(
                scope,
                file_id,
                "batch_output",
                f"{batch.batch_id}_{name}.jsonl",
                self._output(batch, succeeded=succeeded, tally=tally),
            )
            if written.bytes:
                files[f"{name}_file_id"] = file_id
            else:
                await self.store.files.delete(scope, file_id)
        # An expired batch's `expired_at` was set when its window closed.
        stamp = {"completed": {"completed_at": now}, "cancelled": {"cancelled_at": now}}
        await self.store.batches.move(
            batch.batch_id,
            final,
            came_from=("finalizing",),
            completed=tally["completed"],
            failed=tally["failed"],
            **stamp.get(final, {}),
            **files,
        )

    async def _output(
        self, batch: Batch, *, succeeded: bool, tally: dict[str, int]
    ) -> AsyncIterator[bytes]:
        """The output file's lines (`succeeded`) or the error file's, CHUNK_BYTES at a time."""
        buffer = bytearray()
        after = -1
        while page := await self.store.batches.outcomes(batch.batch_id, after, PAGE):
            after = page[-1].line
            for outcome in page:
                ok = outcome.job.state == JobState.SUCCEEDED and outcome.response is not None
                if ok != succeeded:
                    continue
                tally["completed" if ok else "failed"] += 1
                line = output_line(batch, outcome) if ok else error_line(batch, outcome)
                buffer += json.dumps(line).encode() + b"\n"
                if len(buffer) >= CHUNK_BYTES:
                    yield bytes(buffer[:CHUNK_BYTES])
                    del buffer[:CHUNK_BYTES]
        if buffer:
            yield bytes(buffer)


def owner(batch: Batch) -> Scope:
    """The scope of the batch's author: what the runner reads and submits as."""
    return Scope(batch.org, batch.author)


def output_line(batch: Batch, outcome: Outcome) -> dict[str, Any]:
    assert outcome.response is not None
    if batch.endpoint == "/v1/chat/completions":
        body = chat_completion(outcome.prompt, outcome.job, outcome.response)
    else:
        answer = outcome.response
        body = response_object(
            outcome.prompt,
            outcome.job,
            text=answer.text,
            finish_reason=answer.finish_reason,
            model=answer.model,
        )
    return {
        "id": "batch_req_" + outcome.job.job_id.removeprefix("job_"),
        "custom_id": outcome.custom_id,
        "response": {"status_code": 200, "request_id": outcome.job.job_id, "body": body},
        "error": None,
    }


# The HTTP status a line's failure is reported with, by error kind.
STATUS_OF_KIND: dict[ErrorKind, int] = {
    ErrorKind.PROVIDER_4XX: 400,
    ErrorKind.PARSE: 502,
    ErrorKind.AUTH: 401,
    ErrorKind.RATE_LIMIT: 429,
    ErrorKind.TIMEOUT: 504,
}


def error_line(batch: Batch, outcome: Outcome) -> dict[str, Any]:
    job = outcome.job
    line_id = "batch_req_" + job.job_id.removeprefix("job_")
    if job.state != JobState.FAILED:
        code = "batch_expired" if batch.expired_at is not None else "batch_cancelled"
        message = (
            "This request could not be executed before the completion window expired."
            if code == "batch_expired"
            else "This request was not executed because the batch was cancelled."
        )
        return {
            "id": line_id,
            "custom_id": outcome.custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    kind = job.error_kind or ErrorKind.UNKNOWN
    status = STATUS_OF_KIND.get(kind, 500)
    error = {
        "message": f"{kind.value}: {job.error_message or 'the job failed'}",
        "type": error_type(status),
        "param": None,
        "code": kind.value,
    }
    return {
        "id": line_id,
        "custom_id": outcome.custom_id,
        "response": {"status_code": status, "request_id": job.job_id, "body": {"error": error}},
        "error": None,
    }
