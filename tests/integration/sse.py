"""A minimal Server-Sent Events reader for tests: collects events as they arrive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.conftest import eventually

STATE_CHANGED = "job.state_changed"


@dataclass
class Stream:
    events: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    def states_of(self, job_id: str) -> list[str]:
        """The job's states, one per `job.state_changed` event."""
        return [
            e["data"]["state"]
            for e in self.events
            if e.get("event") == STATE_CHANGED and e["data"]["job_id"] == job_id
        ]

    @property
    def ended(self) -> bool:
        """The server ended the stream (or the reader failed: see `reader.exception()`)."""
        return self.reader is not None and self.reader.done()

    async def until(self, condition: Callable[[Stream], bool], timeout: float = 20.0) -> None:
        async def probe() -> Stream:
            return self

        await eventually(probe, condition, timeout=timeout)


async def _read(response: httpx.Response, stream: Stream) -> None:
    event: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line:
            if "data" in event:
                stream.events.append(event)
            event = {}
        elif line.startswith("data:"):
            event["data"] = json.loads(line[5:].strip())
        elif line.startswith(("event:", "id:")):
            key, _, value = line.partition(":")
            event[key] = value.strip()


@asynccontextmanager
async def sse(
    http: httpx.AsyncClient, path: str = "/v1/events", **params: str
) -> AsyncIterator[Stream]:
    """Open the stream (its response headers have arrived when this yields), read it in the
    background; `stream.reader` ends when the server ends the stream."""
    stream = Stream()
    async with http.stream(
        "GET", path, params=params, timeout=httpx.Timeout(10, read=None)
    ) as response:
        assert response.status_code == 200, await response.aread()
        stream.reader = asyncio.create_task(_read(response, stream))
        try:
            yield stream
        finally:
            stream.reader.cancel()
            await asyncio.gather(stream.reader, return_exceptions=True)
