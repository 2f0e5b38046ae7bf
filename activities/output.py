"""A worker's streaming attempts: their text and tool calls go to the projection in batches,
and their job rows are watched so that a cancelled job's provider call is closed at once.

Writes are bounded whatever the token rate: a job's text is written at most once per
`flush_s` (the first text after a quiet spell at once, so the first token shows without
waiting) or when `flush_chars` are waiting, and every due job of the worker shares one
transaction. The watch reads the rows of every attempt in flight in one query per
`watch_s`: a row that is no longer this attempt's running one (cancelled, settled, or taken
over by a later attempt), or that has a cancel request, stops the call; Temporal's own
cancellation arrives later, on a heartbeat."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sqlalchemy.exc import SQLAlchemyError

from activities.adapters.base import StreamedOutput
from projections.domain.lifecycle import JobState
from projections.reads import AttemptStanding
from projections.streams import OutputBatch, OutputWritten, calls_size

log = logging.getLogger("promptjobs.worker")

AppendOutputs = Callable[[list[OutputBatch]], Awaitable[list[OutputWritten]]]
ReadStandings = Callable[[list[str]], Awaitable[dict[str, AttemptStanding]]]


@dataclass(eq=False)
class AttemptStream:
    """One attempt's output as it streams, and how much of it is in the projection."""

    job_id: str
    attempt: int
    on_stop: Callable[[str], None]
    output: StreamedOutput = field(init=False)
    flushed: int = 0
    # How far the tool calls had streamed at the last write (projections.streams.calls_size).
    flushed_calls: int = 0
    last_flush_at: float = float("-inf")
    # Why the call was stopped (the row's word), once it was.
    stopped: str | None = None
    # Text arrived since the last flush and the flusher knows it.
    armed: bool = False
    # Set while a write of this stream's text is on its way (at most one at a time).
    in_flight: asyncio.Event | None = None

    @property
    def pending(self) -> int:
        """Characters streamed and not written yet: text, and tool calls' ids, names and
        arguments."""
        calls = self.output.calls_size - self.flushed_calls
        return self.output.length - self.flushed + calls

    def unwritten(self) -> OutputBatch | None:
        """The text not in the projection yet, and the tool calls if they grew, if any."""
        if self.pending <= 0:
            return None
        grew = self.output.calls_size > self.flushed_calls
        return OutputBatch(
            self.job_id,
            self.attempt,
            self.flushed,
            self.output.since(self.flushed),
            self.output.streaming_calls if grew else None,
        )

    def written(self, batch: OutputBatch) -> None:
        """`batch` is in the projection (or was refused for good: a stale attempt's)."""
        self.flushed = batch.offset + len(batch.text)
        if batch.tool_calls is not None:
            self.flushed_calls = calls_size(batch.tool_calls)

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
            self.on_stop(why)


class OutputStreams:
    """The worker's one flusher and one watch, shared by its attempts."""

    def __init__(
        self,
        append: AppendOutputs,
        standings: ReadStandings,
        *,
        flush_s: float = 0.1,
        flush_chars: int = 4096,
        watch_s: float = 0.25,
    ) -> None:
        self._append = append
        self._standings = standings
        self.flush_s = flush_s
        self.flush_chars = flush_chars
        self.watch_s = watch_s
        self._streams: set[AttemptStream] = set()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        # Writes on their way: several at once, each of other streams, so text that comes
        # while one is in flight need not wait for it (the process's GroupCommit puts what
        # queues together into one transaction).
        self._in_flight: set[asyncio.Task[None]] = set()
        self._failed_writes = 0
        self._failed_watches = 0

    def open(self, job_id: str, attempt: int, on_stop: Callable[[str], None]) -> AttemptStream:
        stream = AttemptStream(job_id, attempt, on_stop)
        stream.output = StreamedOutput(on_delta=lambda: self._delta(stream))
        self._streams.add(stream)
        # Each loop runs in a context of its own: not the activity's that happened to start it
        # (whose info, heartbeats and cancellation are that attempt's alone).
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(
                self._flush_loop(), name="output-flusher", context=contextvars.Context()
            )
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(
                self._watch_loop(), name="cancel-watch", context=contextvars.Context()
            )
        return stream

    async def close(self, stream: AttemptStream) -> None:
        """The attempt is over: stop flushing it, once its write on the way (if any) is done.
        What it has not written (`stream.unwritten()`) the caller writes with the attempt's
        end, in the same transaction."""
        self._streams.discard(stream)  # no new write of it starts from here on
        if stream.in_flight is not None:
            await stream.in_flight.wait()

    def _delta(self, stream: AttemptStream) -> None:
        # One wake per stream per flush (the flusher then knows when it is due), and one more
        # if enough text is waiting: not one per token.
        if not stream.armed or stream.pending >= self.flush_chars:
            stream.armed = True
            self._wake.set()

    # -- the flusher ----------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while self._streams:
            self._wake.clear()  # before looking: a delta from now on wakes the wait below
            now = time.monotonic()
            idle = [s for s in self._streams if s.in_flight is None]
            due = [s for s in idle if s.pending > 0 and self._is_due(s, now)]
            if due:
                self._start_write(due, now)
                continue
            waiting = [s.last_flush_at + self.flush_s - now for s in idle if s.pending]
            try:
                timeout = max(0.0, min(waiting)) if waiting else self.flush_s
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _is_due(self, stream: AttemptStream, now: float) -> bool:
        return stream.pending >= self.flush_chars or now - stream.last_flush_at >= self.flush_s

    def _start_write(self, due: list[AttemptStream], now: float) -> None:
        batches = []
        for stream in due:
            batch = stream.unwritten()
            assert batch is not None, "a due stream has text pending"
            batches.append(batch)
        for stream in due:
            stream.in_flight = asyncio.Event()
            stream.last_flush_at = now  # the interval counts from a write's start
        task = asyncio.create_task(self._write(due, batches))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _write(self, due: list[AttemptStream], batches: list[OutputBatch]) -> None:
        try:
            written = await self._append(batches)
        except Exception as err:
            # The text stays in memory: a later flush writes it, or the attempt's end does,
            # waiting out an outage there (so an attempt never waits on a flush for longer
            # than one write).
            self._failed_writes += 1
            if self._failed_writes == 1 or self._failed_writes % 50 == 0:
                log.warning(
                    "cannot write streamed output of %d job(s) (try %d), keeping it: %s",
                    len(due),
                    self._failed_writes,
                    err.__class__.__name__,
                )
            written = None
        else:
            self._failed_writes = 0
        for i, stream in enumerate(due):
            if written is not None:
                stream.written(batches[i])
                if not written[i].running:
                    stream.stop("the job is no longer running this attempt")
            stream.armed = stream.pending > 0
            assert stream.in_flight is not None
            stream.in_flight.set()
            stream.in_flight = None
        self._wake.set()  # what came meanwhile is the loop's to schedule

    # -- the watch ------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        while self._streams:
            await asyncio.sleep(self.watch_s)
            streams = [s for s in self._streams if s.stopped is None]
            if not streams:
                continue
            try:
                rows = await self._standings([s.job_id for s in streams])
            except (SQLAlchemyError, OSError) as err:
                # An outage: the calls go on (Temporal's cancellation still reaches them).
                self._failed_watches += 1
                if self._failed_watches == 1 or self._failed_watches % 200 == 0:
                    log.warning(
                        "cannot watch the rows of running jobs (try %d): %s",
                        self._failed_watches,
                        err.__class__.__name__,
                    )
                continue
            self._failed_watches = 0
            for stream in streams:
                row = rows.get(stream.job_id)
                if row is None:
                    continue
                if row.cancel_requested:
                    stream.stop("a cancel was requested")
                elif row.state is not JobState.RUNNING or row.attempt != stream.attempt:
                    stream.stop(f"the job is {row.state.value} at attempt {row.attempt}")
