"""A test client's view of GET /v1/events, read with httpx-sse as a real client would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import aconnect_sse

STATE_CHANGED = "job.state_changed"


@dataclass(frozen=True)
class Received:
    id: int
    job: dict[str, Any]

    @property
    def job_id(self) -> str:
        return str(self.job["job_id"])

    @property
    def state(self) -> str:
        return str(self.job["state"])


def latest_by_job(events: list[Received]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        rows[event.job_id] = event.job
    return rows


def all_terminal(job_ids: set[str]) -> Callable[[list[Received]], bool]:
    terminal = {"succeeded", "failed", "cancelled", "superseded"}

    def done(events: list[Received]) -> bool:
        rows = latest_by_job(events)
        return job_ids <= rows.keys() and all(rows[j]["state"] in terminal for j in job_ids)

    return done


async def read_events(
    client: httpx.AsyncClient,
    until: Callable[[list[Received]], bool],
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    on_connected: Callable[[], Any] | None = None,
    timeout: float = 20.0,
) -> list[Received]:
    """Stream until `until(events so far)` holds, then disconnect; fail after `timeout`.

    `on_connected` (sync or async) runs once the server has confirmed the stream is open."""
    received: list[Received] = []
    try:
        async with (
            asyncio.timeout(timeout),
            aconnect_sse(
                client, "GET", "/v1/events", params=params, headers=dict(headers or {})
            ) as source,
        ):
            assert source.response.status_code == 200, await source.response.aread()
            async for sse in source.aiter_sse():
                if sse.event != STATE_CHANGED:
                    if on_connected is not None:
                        outcome = on_connected()
                        if asyncio.iscoroutine(outcome):
                            await outcome
                        on_connected = None
                    continue
                received.append(Received(int(sse.id), json.loads(sse.data)))
                if until(received):
                    return received
    except TimeoutError as err:
        raise AssertionError(f"stream condition not met in {timeout}s; got {received}") from err
    raise AssertionError(f"stream ended early; got {received}")
