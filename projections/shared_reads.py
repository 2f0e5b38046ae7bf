"""One read for many waiters: the requests that find a cached value stale at the same moment
share one query instead of making one each.

Under load a cache that expires for everyone at once is a burst: at 32 requests in flight,
32 identical lookups land together every time a hot entry's time runs out, and each waits
behind the others' (bench/README.md, issue 50). `SharedReads` keeps at most one read per key
in flight; every caller asking meanwhile awaits that read's answer (or its error)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SharedReads(Generic[K, V]):
    def __init__(self) -> None:
        self._pending: dict[K, asyncio.Future[V]] = {}

    def pending(self, key: K) -> bool:
        return key in self._pending

    async def read(self, key: K, fetch: Callable[[], Awaitable[V]]) -> V:
        """`fetch()`'s answer, from the read of `key` already in flight if there is one. A
        caller cancelled while it waits leaves the read running for the others."""
        future = self._pending.get(key)
        if future is None:
            future = asyncio.ensure_future(fetch())
            self._pending[key] = future
            future.add_done_callback(lambda done: self._settled(key, done))
        return await asyncio.shield(future)

    def _settled(self, key: K, done: asyncio.Future[V]) -> None:
        if self._pending.get(key) is done:
            del self._pending[key]
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have been cancelled meanwhile
