"""A read a worker repeats at most every so often, however many attempts ask for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class AtMostEvery:
    """Runs `read` when the last run is `interval_s` old. Attempts that ask while a run is on
    its way wait for that run instead of starting their own: a worker starting 100 attempts
    at once reads once, not 100 times."""

    def __init__(self, interval_s: float, read: Callable[[], Awaitable[None]]) -> None:
        self.interval_s = interval_s
        self._read = read
        self._done_at = -1e9
        self._running: asyncio.Future[None] | None = None

    async def __call__(self) -> None:
        if time.monotonic() - self._done_at < self.interval_s:
            return
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._run())
        # Shielded: one caller cancelled (its attempt ended) does not cancel the others' read.
        await asyncio.shield(self._running)

    async def _run(self) -> None:
        try:
            await self._read()
        finally:
            self._done_at = time.monotonic()
