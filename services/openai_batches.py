"""OpenAI's Batch API over promptjobs jobs: each line of the input file becomes one prompt and
its job (in bulk transactions, the file read a chunk at a time), and the batch moves through
OpenAI's statuses as its jobs settle. `BatchRunner` does that work in every API process;
every step is guarded in the database, so processes sweeping at once, or one that died half
way, never accept a line twice nor lose one. The lines' wire shapes (OpenAI's request and
result lines) are the API's (api/openai/batches.py), handed in as a `BatchWire`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Protocol

from projections.domain.lifecycle import JobState
from projections.errors import InvalidState, NotFound
from projections.event_log import utcnow
from projections.files import CHUNK_BYTES, new_file_id
from projections.models import Batch
from projections.openai_batches import Line, Outcome
from projections.scope import Scope
from projections.store import JobStore
from services.jobs import JobService

log = logging.getLogger("promptjobs.batches")

# Lines accepted per transaction, and jobs cancelled or lines written out per read.
ACCEPT_BATCH = 500
PAGE = 500
# Lines parsed between two turns of other requests on the API's event loop.
YIELD_EVERY = 50
# Validation errors a failed batch reports (the count says how many there were).
MAX_ERRORS = 1000
# A batch left `finalizing` this long (its process died writing the files) is finalized again.
FINALIZE_STALE = timedelta(minutes=5)


class LineError(Exception):
    """A line of an input file that cannot become a job, as OpenAI reports it."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


class BatchWire(Protocol):
    """A batch's lines as its API speaks them."""

    @property
    def max_line_bytes(self) -> int:
        """The longest line read; a longer one is parsed as None."""
        ...

    def parse(self, raw: bytes | None, number: int, endpoint: str, seen: set[str]) -> Line:
        """Line `number` (from 0) as a Line whose submission has passed the job service's
        check, or a LineError (`seen`: the custom_ids before it)."""
        ...

    def output_line(self, batch: Batch, outcome: Outcome) -> dict[str, Any]:
        """A succeeded line of the output file."""
        ...

    def error_line(self, batch: Batch, outcome: Outcome) -> dict[str, Any]:
        """A failed, cancelled or expired line of the error file."""
        ...


class BatchRunner:
    """Moves every active `/v1/batches` batch on: validating (its lines read, parsed by
    `wire` and accepted as jobs through the job service), in progress, cancelling,
    finalizing (the output and error files written by `wire`)."""

    def __init__(
        self,
        store: JobStore,
        jobs: JobService,
        wire: BatchWire,
        *,
        max_lines: int = 50_000,
        interval_s: float = 1.0,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.wire = wire
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
            group.append(self.wire.parse(raw, number, batch.endpoint, seen))
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
        return await self.jobs.submit_lines(batch, first, group)

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
                line = self.wire.parse(raw, count - 1, batch.endpoint, seen)
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
        lines = self.store.files.lines(org, batch.input_file_id, self.wire.max_line_bytes)
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
                line = (
                    self.wire.output_line(batch, outcome)
                    if ok
                    else self.wire.error_line(batch, outcome)
                )
                buffer += json.dumps(line).encode() + b"\n"
                if len(buffer) >= CHUNK_BYTES:
                    yield bytes(buffer[:CHUNK_BYTES])
                    del buffer[:CHUNK_BYTES]
        if buffer:
            yield bytes(buffer)


def owner(batch: Batch) -> Scope:
    """The scope of the batch's author: what the runner reads and submits as."""
    return Scope(batch.org, batch.author)
