"""How an activity's projection writes wait out a database outage: infrastructure failure is
not the job's failure."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio import activity

from projections.errors import database_unavailable

T = TypeVar("T")

# How an attempt waits for the projection database to come back: growing, jittered pauses.
OUTAGE_FIRST_WAIT_S = 0.5
OUTAGE_MAX_WAIT_S = 5.0


async def through_outages(
    what: str,
    write: Callable[[], Awaitable[T]],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
) -> T:
    """Run a projection write (or read), waiting out a database outage however long it lasts.

    The database being unreachable is not the job's failure: raised out of the activity it
    would spend one of the job's attempts (Temporal retries by attempt) and, once they were
    spent, decide its outcome. So the attempt waits here instead, heartbeating all along (the
    caller's `heartbeating`), until the write lands or the job's ceiling cancels the attempt
    (the workflow then fails it as `stuck`, which a settle activity records once the
    database is back: those retry without limit)."""
    logger = logger or activity.logger
    wait_s = OUTAGE_FIRST_WAIT_S
    failures = 0
    while True:
        try:
            return await write()
        except Exception as err:
            if not database_unavailable(err):
                raise
            failures += 1
            if failures == 1 or failures % 20 == 0:
                logger.warning(
                    "projection database unavailable (%s, try %d), waiting: %s",
                    what,
                    failures,
                    err.__class__.__name__,
                )
        await asyncio.sleep(wait_s * (0.5 + random.random()))
        wait_s = min(OUTAGE_MAX_WAIT_S, wait_s * 2)
