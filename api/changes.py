"""Wakes SSE streams when a transition commits, instead of making them poll hard."""

from __future__ import annotations

import asyncio


class ChangeFeed:
    """`notify()` after a commit; a reader takes `current()` *before* it queries, then waits on
    it, so a commit between the query and the wait is never missed. Commits made by another
    process are picked up by the reader's poll interval."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def current(self) -> asyncio.Event:
        return self._event
