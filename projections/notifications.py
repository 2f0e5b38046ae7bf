"""PostgreSQL LISTEN/NOTIFY for job events: the channel, the in-transaction NOTIFY, the listener.

Every transaction that appends to job_events also issues `pg_notify` on one channel, so the
notification is delivered exactly when the events become visible (at commit) and never for
a rolled-back append. An API process holds one dedicated connection that LISTENs and wakes
its SSE streams; SQLite has no such thing, and there the streams keep their poll interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

EVENTS_CHANNEL = "promptjobs_events"
RECONNECT_INITIAL_S = 0.1

log = logging.getLogger("promptjobs.notifications")


async def notify_event(session: AsyncSession, event_id: int) -> None:
    """Queue a notification for `event_id`; PostgreSQL sends it when the transaction commits."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": EVENTS_CHANNEL, "payload": str(event_id)},
        )


def libpq_url(url: str) -> str:
    """The projection URL as libpq understands it (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class EventListener:
    """One connection that LISTENs on the events channel and calls `wake` per notification.

    A dropped connection is reopened with backoff; after every (re)connect `wake` is called
    once, because whatever committed while nobody listened produced no notification the
    readers could see. Readers re-query on every wake, so a spurious one costs a query only.
    """

    def __init__(
        self,
        url: str,
        wake: Callable[[], None],
        *,
        liveness_check_s: float = 30.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.conninfo = libpq_url(url)
        self.wake = wake
        self.liveness_check_s = liveness_check_s
        self.max_backoff_s = max_backoff_s
        self.listening = asyncio.Event()
        self.connections = 0

    async def run(self) -> None:
        """Listen until cancelled."""
        delay = RECONNECT_INITIAL_S
        while True:
            opened_before = self.connections
            try:
                await self._listen()
            except psycopg.Error as err:
                log.warning("LISTEN %s: connection lost (%s); reconnecting", EVENTS_CHANNEL, err)
            finally:
                self.listening.clear()
            if self.connections > opened_before:
                delay = RECONNECT_INITIAL_S  # it worked until now: a new outage starts afresh
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, application_name="promptjobs-listen"
        ) as conn:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(EVENTS_CHANNEL)))
            self.connections += 1
            self.listening.set()
            self.wake()
            while True:
                async for _ in conn.notifies(timeout=self.liveness_check_s):
                    self.wake()
                # A half-open TCP connection delivers nothing and raises nothing: ask.
                await conn.execute("SELECT 1")
