"""Wakes SSE streams when a transition commits, instead of making each stream poll."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("promptjobs.api")


class ChangeFeed:
    """`notify()` after a commit; a reader takes `current()` *before* it queries, then waits on
    it, so a commit between the query and the wait is never missed.

    Commits made in this process notify directly. Commits made by another process (a worker
    of its own, a second API) wake it through PostgreSQL's LISTEN/NOTIFY
    (projections/notifications.py), and, on SQLite, are noticed by one watcher per process
    that reads the event log's newest id every poll interval while any stream is open, so a
    thousand open streams cost one cheap query per interval, not a thousand.

    `close()` on shutdown wakes every reader one last time and tells it to end its stream."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.closed = False
        self._streams = 0
        self._watcher: asyncio.Task[None] | None = None

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def close(self) -> None:
        self.closed = True
        self.notify()

    def current(self) -> asyncio.Event:
        return self._event

    @property
    def watching_now(self) -> bool:
        return self._watcher is not None and not self._watcher.done()

    @asynccontextmanager
    async def watching(
        self, newest_id: Callable[[], Awaitable[int]], interval_s: float
    ) -> AsyncIterator[None]:
        """Held by each open stream; the watcher runs while at least one is held."""
        self._streams += 1
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch(newest_id, interval_s))
        try:
            yield
        finally:
            self._streams -= 1

    async def _watch(self, newest_id: Callable[[], Awaitable[int]], interval_s: float) -> None:
        # Not cancelled from outside (a read cut off mid-transaction could keep SQLite locked):
        # it ends by itself within an interval once the last stream has closed.
        seen: int | None = None
        while self._streams > 0 and not self.closed:
            try:
                newest = await newest_id()
            except (SQLAlchemyError, OSError) as err:
                # Streams keep their safety-net wake-up; the next interval tries again.
                log.warning("change feed cannot read the event log: %s", err)
            else:
                if seen is not None and newest != seen:
                    self.notify()
                seen = newest
            await asyncio.sleep(interval_s)
