"""One reader per API process tails the event log and fans each event out to the streams it
concerns, through a bounded queue per stream."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from sse_starlette import ServerSentEvent

from api.schemas import JobOut, OutputChunk, OutputReset
from projections.domain.errors import Refused
from projections.domain.lifecycle import EventType
from projections.models import JobEvent
from projections.rows import listed
from projections.scope import Scope

log = logging.getLogger("promptjobs.api")

# Events the reader takes from the log per query; a burst larger than this is read in turns.
READ_BATCH = 500
# Streams woken per turn of the event loop after a read. Woken all at once, hundreds of
# streams writing their frames hold the loop for milliseconds, and each step of a request
# (a submit takes several) waits behind them all; in turns, requests go in between.
WAKE_TURN = 25

ReadAfter = Callable[[int, int], Awaitable[list[JobEvent]]]
NewestId = Callable[[], Awaitable[int]]
LiveKeys = Callable[[set[str]], Awaitable[set[str]]]


def frame(event: JobEvent) -> bytes:
    """The event as the bytes of one SSE message: encoded once, shared by every stream.
    (A row logged before events left long options out is cut the same way here.)"""
    shape = DATA_SHAPES.get(event.type)
    if shape is None:
        data = listed(JobOut.model_validate(event.data)).model_dump_json()
    else:
        data = shape.model_validate(event.data).model_dump_json(exclude_none=True)
    return ServerSentEvent(data=data, event=event.type, id=str(event.id)).encode()


# Each event type's data on the wire; a type that carries the job row is JobOut.
DATA_SHAPES: dict[str, type[BaseModel]] = {
    EventType.OUTPUT: OutputChunk,
    EventType.OUTPUT_RESET: OutputReset,
}


class LiveEvent:
    """An event the reader took from the log; its frame is encoded the first time a stream
    needs it, so an event no stream wants costs no JSON."""

    __slots__ = ("_frame", "_row", "author", "id", "job_id", "org", "prompt_id", "type")

    def __init__(self, row: JobEvent) -> None:
        self._row: JobEvent | None = row
        self._frame: bytes | None = None
        self.id = row.id
        self.type = row.type
        self.org = row.org
        self.author = row.author
        self.job_id = row.job_id
        self.prompt_id = row.prompt_id

    @property
    def frame(self) -> bytes:
        if self._frame is None:
            assert self._row is not None
            self._frame, self._row = frame(self._row), None
        return self._frame


@dataclass(frozen=True)
class StreamScope:
    """What one stream may and wants to see: the caller's org (None: every org, the
    operator), a member's own prompts, and the request's `job_id` / `prompt_id` filters."""

    org: str | None
    author: str | None = None
    job_id: str | None = None
    prompt_id: str | None = None

    @classmethod
    def of(cls, scope: Scope, job_id: str | None, prompt_id: str | None) -> StreamScope:
        return cls(None if scope.all_orgs else scope.org, scope.author, job_id, prompt_id)

    def matches(self, event: LiveEvent) -> bool:
        return (
            (self.org is None or event.org == self.org)
            and (self.author is None or event.author == self.author)
            and (self.job_id is None or event.job_id == self.job_id)
            and (self.prompt_id is None or event.prompt_id == self.prompt_id)
        )


class Ended(StrEnum):
    """Why the feed ended a stream; the client resumes with Last-Event-ID in every case."""

    OVERFLOW = "overflow"  # the client read slower than its events came
    REVOKED = "revoked"  # its API key was revoked
    CLOSED = "closed"  # the API is shutting down


class StreamLimit(Refused):
    """No room for another stream: per key or per process."""

    code = "too_many_streams"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(eq=False)
class StreamHold:
    """A stream's place held for `key_id` until the stream subscribes (FanOut.hold)."""

    key_id: str
    taken: bool = False


@dataclass(eq=False)
class Subscription:
    """One open stream. The reader appends the events it concerns; the stream takes them."""

    scope: StreamScope
    key_id: str
    limit: int
    # The reader's position when the stream joined: every event after it comes through
    # the queue, every event up to it the stream reads from the log itself (its backlog).
    start: int = 0
    ended: Ended | None = None
    _queue: deque[LiveEvent] = field(default_factory=deque)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, events: list[LiveEvent]) -> bool:
        """Queue `events` (`wake` then tells the stream); False (and nothing queued) if
        that would pass the limit."""
        if len(self._queue) + len(events) > self.limit:
            return False
        self._queue.extend(events)
        return True

    def wake(self) -> None:
        self._ready.set()

    def end(self, why: Ended) -> None:
        if self.ended is None:
            self.ended = why
        if why is Ended.REVOKED:
            self._queue.clear()  # not one more event for a revoked key
        self._ready.set()

    async def take(self, timeout_s: float) -> list[LiveEvent]:
        """What is queued, waiting up to `timeout_s` for something if nothing is."""
        if not self._queue and self.ended is None:
            self._ready.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._ready.wait()
            except TimeoutError:
                pass
        events = list(self._queue)
        self._queue.clear()
        return events


@dataclass
class _Routes:
    """An org's streams, filed by their most selective filter, so an event visits only the
    streams it can concern (the many small `job.output` events of one job visit that
    job's and its prompt's streams and the whole-org ones, not every stream of the org)."""

    whole: set[Subscription] = field(default_factory=set)
    by_author: dict[str, set[Subscription]] = field(default_factory=dict)
    by_job: dict[str, set[Subscription]] = field(default_factory=dict)
    by_prompt: dict[str, set[Subscription]] = field(default_factory=dict)

    def _index(self, scope: StreamScope) -> tuple[dict[str, set[Subscription]], str] | None:
        if scope.job_id is not None:
            return self.by_job, scope.job_id
        if scope.prompt_id is not None:
            return self.by_prompt, scope.prompt_id
        if scope.author is not None:
            return self.by_author, scope.author
        return None

    def add(self, sub: Subscription) -> None:
        filed = self._index(sub.scope)
        if filed is None:
            self.whole.add(sub)
        else:
            index, key = filed
            index.setdefault(key, set()).add(sub)

    def remove(self, sub: Subscription) -> None:
        filed = self._index(sub.scope)
        if filed is None:
            self.whole.discard(sub)
            return
        index, key = filed
        bucket = index.get(key)
        if bucket is not None:
            bucket.discard(sub)
            if not bucket:
                del index[key]

    def candidates(self, event: LiveEvent) -> Iterable[Subscription]:
        yield from self.whole
        for index, key in (
            (self.by_author, event.author),
            (self.by_job, event.job_id),
            (self.by_prompt, event.prompt_id),
        ):
            bucket = index.get(key)
            if bucket:
                yield from bucket

    def __bool__(self) -> bool:
        return bool(self.whole or self.by_author or self.by_job or self.by_prompt)


class ChangeFeed:
    """The API process's one reader of the event log, and its streams.

    `notify()` after a commit wakes the reader: commits in this process call it directly,
    PostgreSQL's LISTEN/NOTIFY calls it for commits of other processes
    (projections/notifications.py), and on SQLite the reader looks every poll interval (a
    safety net on PostgreSQL). It runs while any stream is open and reads each new batch
    once (`read_after`, one store method, so how the log is ordered stays the store's
    business), whatever the number of streams; each event goes to the streams whose scope
    it matches, in memory. A stream whose queue would pass its limit is ended (the client
    resumes from the log with Last-Event-ID), so a slow client costs neither memory nor
    other streams anything.

    It also bounds the streams (per API key, per process) and ends the streams of a
    revoked key: every `key_check_s` one query asks which of the open streams' keys still
    stand. `close()` on shutdown ends every stream."""

    def __init__(
        self,
        *,
        max_streams: int = 2000,
        max_streams_per_key: int = 50,
        buffer_events: int = 1000,
        poll_interval_s: float = 0.02,
        key_check_s: float = 5.0,
    ) -> None:
        self.max_streams = max_streams
        self.max_streams_per_key = max_streams_per_key
        self.buffer_events = buffer_events
        # One read never brings a stream more than its buffer holds: only a stream that
        # did not take the previous batch can overflow.
        self.read_batch = min(READ_BATCH, buffer_events)
        self.poll_interval_s = poll_interval_s
        self.key_check_s = key_check_s
        self.closed = False
        self.position = 0
        self.reads = 0  # log reads by the reader (tests and the benchmark look)
        self._wake = asyncio.Event()
        self._streams: set[Subscription] = set()
        self._per_key: dict[str, int] = {}
        # Places held for streams not yet subscribed (`hold`).
        self._held = 0
        self._routes: dict[str | None, _Routes] = {}
        self._reader: asyncio.Task[None] | None = None
        self._positioned = asyncio.Event()
        self._read_after: ReadAfter | None = None
        self._newest_id: NewestId | None = None
        self._live_keys: LiveKeys | None = None

    def attach(self, read_after: ReadAfter, newest_id: NewestId, live_keys: LiveKeys) -> None:
        """Where the reader reads: the log after an id, its newest id, the keys still valid."""
        self._read_after, self._newest_id, self._live_keys = read_after, newest_id, live_keys

    def notify(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        for sub in list(self._streams):
            sub.end(Ended.CLOSED)
        self.notify()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def reading_now(self) -> bool:
        return self._reader is not None and not self._reader.done()

    # -- streams --------------------------------------------------------------------------

    def _room_for(self, key_id: str) -> None:
        """Raise StreamLimit if no stream more fits, for this key or this process."""
        if len(self._streams) + self._held >= self.max_streams:
            raise StreamLimit(
                f"this API process has its maximum of {self.max_streams} open streams"
            )
        if self._per_key.get(key_id, 0) >= self.max_streams_per_key:
            raise StreamLimit(
                f"this API key has its maximum of {self.max_streams_per_key} open streams "
                "on this API process; close one, or share one stream between consumers"
            )

    def hold(self, key_id: str) -> StreamHold:
        """A stream's place, taken before what it will stream is made (a response its own
        request creates): StreamLimit comes before anything is made, so a client that retries
        the refusal makes nothing twice. `subscribe(..., hold)` turns it into the stream;
        `release` gives back a hold that was not."""
        self._room_for(key_id)
        self._held += 1
        self._per_key[key_id] = self._per_key.get(key_id, 0) + 1
        return StreamHold(key_id)

    def release(self, hold: StreamHold) -> None:
        """Idempotent; nothing once the hold became a stream."""
        if hold.taken:
            return
        hold.taken = True
        self._held -= 1
        self._drop_key(hold.key_id)

    def _drop_key(self, key_id: str) -> None:
        left = self._per_key[key_id] - 1
        if left:
            self._per_key[key_id] = left
        else:
            del self._per_key[key_id]

    async def subscribe(
        self, scope: StreamScope, key_id: str, hold: StreamHold | None = None
    ) -> Subscription:
        """Join the live feed; raises StreamLimit past a bound (not with a `hold`, whose place
        it takes). `start` on the result says where the live feed begins for it."""
        if hold is None:
            self._room_for(key_id)
            self._per_key[key_id] = self._per_key.get(key_id, 0) + 1
        else:
            assert not hold.taken and hold.key_id == key_id
            hold.taken = True
            self._held -= 1
        sub = Subscription(scope, key_id, self.buffer_events)
        self._streams.add(sub)
        try:
            if not self.reading_now:
                self._positioned = asyncio.Event()
                self._reader = asyncio.create_task(self._run(), name="event-log-reader")
            await self._positioned.wait()
        except BaseException:
            self.unsubscribe(sub)
            raise
        if self.closed:
            sub.end(Ended.CLOSED)
        # No await from here on: the reader cannot deliver between reading `start` and the
        # stream's joining the routes, so every event after `start` reaches it.
        sub.start = self.position
        self._routes.setdefault(scope.org, _Routes()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Idempotent: the stream's own end and the response's cleanup both call it."""
        if sub not in self._streams:
            return
        self._streams.discard(sub)
        self._drop_key(sub.key_id)
        routes = self._routes.get(sub.scope.org)
        if routes is not None:
            routes.remove(sub)
            if not routes:
                del self._routes[sub.scope.org]

    # -- the reader -----------------------------------------------------------------------

    async def _run(self) -> None:
        # Not cancelled from outside (a read cut off mid-transaction could keep SQLite
        # locked): it ends by itself once the last stream has closed.
        assert self._read_after is not None and self._newest_id is not None
        while not self._positioned.is_set():
            try:
                self.position = await self._newest_id()
            except (SQLAlchemyError, OSError) as err:
                log.warning("event stream reader cannot read the event log: %s", err)
                await asyncio.sleep(self.poll_interval_s)
                if not self._streams:
                    return
            else:
                self._positioned.set()
        loop = asyncio.get_running_loop()
        next_key_check = loop.time() + self.key_check_s
        while self._streams and not self.closed:
            self._wake.clear()
            try:
                batch = await self._read_after(self.position, self.read_batch)
                self.reads += 1
            except (SQLAlchemyError, OSError) as err:
                # Streams stay open; the next interval tries again from the same position.
                log.warning("event stream reader cannot read the event log: %s", err)
                batch = []
            if batch:
                woken = self._deliver(batch)
                for turn in range(0, len(woken), WAKE_TURN):
                    if turn:
                        await asyncio.sleep(0)
                    for sub in woken[turn : turn + WAKE_TURN]:
                        sub.wake()
            if loop.time() >= next_key_check:
                await self._end_revoked()
                next_key_check = loop.time() + self.key_check_s
            if len(batch) == self.read_batch:
                continue
            try:
                async with asyncio.timeout(self.poll_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _deliver(self, rows: list[JobEvent]) -> list[Subscription]:
        """Queue each event for the streams it concerns, and return those streams, to be
        woken; synchronous, so `position` and the queues move together."""
        touched: dict[Subscription, list[LiveEvent]] = {}
        everywhere = self._routes.get(None)
        for row in rows:
            event = LiveEvent(row)
            for routes in (self._routes.get(event.org), everywhere):
                if routes is None:
                    continue
                for sub in routes.candidates(event):
                    if sub.scope.matches(event):
                        touched.setdefault(sub, []).append(event)
        self.position = rows[-1].id
        woken = []
        for sub, events in touched.items():
            if sub.offer(events):
                woken.append(sub)
            else:
                sub.end(Ended.OVERFLOW)
                self.unsubscribe(sub)
        return woken

    async def _end_revoked(self) -> None:
        assert self._live_keys is not None
        keys = {sub.key_id for sub in self._streams}
        if not keys:
            return
        try:
            live = await self._live_keys(keys)
        except (SQLAlchemyError, OSError) as err:
            log.warning("event stream reader cannot check API keys: %s", err)
            return
        for sub in list(self._streams):
            if sub.key_id not in live:
                sub.end(Ended.REVOKED)
                self.unsubscribe(sub)
