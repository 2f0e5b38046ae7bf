"""Wakes SSE streams when a transition commits, instead of making them poll hard."""

from __future__ import annotations

import asyncio


class ChangeFeed:
    """`notify()` after a commit; a reader takes `current()` *before* it queries, then waits on
    it, so a commit between the query and the wait is never missed. Commits made by another
    process wake it through PostgreSQL's LISTEN/NOTIFY (projections/notifications.py); on
    SQLite they are picked up by the reader's poll interval.

    `close()` on shutdown wakes every reader one last time and tells it to end its stream."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.closed = False

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def close(self) -> None:
        self.closed = True
        self.notify()

    def current(self) -> asyncio.Event:
        return self._event
