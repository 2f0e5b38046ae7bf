"""What the dispatcher's periodic passes share (its scan, the reconciler, the gatherer's
log): paging through rows, one job's failure kept to that job, and Temporal being
unreachable told apart from a refusal and logged without flooding."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from temporalio.service import RPCError, RPCStatusCode

from projections.models import Job

T = TypeVar("T")


class TemporalUnreachable(Exception):
    """Temporal did not take a start or cancel just now; the row keeps it, so the API's
    dispatcher delivers it once Temporal is back."""


def is_unreachable(err: BaseException) -> bool:
    """Temporal as a whole did not answer (as opposed to refusing one job's request)."""
    if isinstance(err, TemporalUnreachable):
        return True
    if isinstance(err, RPCError):
        return err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
    return isinstance(err, RuntimeError)  # a lazy client's failed connect


def first_line(err: BaseException) -> str:
    return ((str(err) or repr(err)).splitlines() or [repr(err)])[0][:300]


class ThrottledLog:
    """Logs a recurring failure with its real cause, at most once per `interval_s` for each
    kind of failure, saying how many of the same kind it held back since."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.interval_s:
            self._last[kind] = (last[0], last[1] + 1)
            return
        if last is not None and last[1]:
            message, args = message + " (and %d more like it since)", (*args, last[1])
        self.logger.warning(message, *args)
        self._last[kind] = (now, 0)


class Passes:
    """Paging and failure handling for passes over job rows."""

    def __init__(self, page_size: int, failures: ThrottledLog) -> None:
        self.page_size = page_size
        self.failures = failures

    async def each(self, fetch: Callable[[Job | None], Awaitable[list[Job]]]) -> AsyncIterator[Job]:
        """Every row `fetch` pages through, page after page (keyset: no row is skipped)."""
        after: Job | None = None
        while True:
            page = await fetch(after)
            for job in page:
                yield job
            if len(page) < self.page_size:
                return
            after = page[-1]

    async def isolated(self, action: str, job: Job, work: Awaitable[T]) -> T | None:
        """Run `work` for one job. Temporal being unreachable ends the pass (every other job
        would wait for the same timeout); anything else is this job's, logged and skipped."""
        try:
            return await work
        except Exception as err:
            if is_unreachable(err):
                raise
            self.failed(action, job.job_id, err)
            return None

    def failed(self, action: str, job_id: str, err: Exception) -> None:
        if is_unreachable(err):
            self.unreachable(err)
        else:
            self.failures.warning(
                action, "could not %s job %s, will retry: %s", action, job_id, first_line(err)
            )

    def unreachable(self, err: BaseException) -> None:
        self.failures.warning(
            "unreachable", "Temporal unreachable, will retry: %s", first_line(err)
        )
