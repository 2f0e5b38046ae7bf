"""Waking jobs that wait in their workflows: a chain's children once their parents have
succeeded, jobs waiting for a running slot of their org once it has one free, and jobs
waiting for room in a provider budget or under a spend cap once it has some."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio.client import Client

from activities.contracts import PARENTS_CHANGED, SLOT_FREED
from projections.store import JobStore
from services.gone import GONE, unless_gone

# Signals in flight at once when the dispatcher wakes jobs waiting for their org's slots.
WAKE_CONCURRENCY = 50


class Waker:
    def __init__(
        self,
        store: JobStore,
        client: Client,
        org_max_running: int = 0,
        *,
        task_queue: str | None = None,
        worker_heartbeat_s: float = 15.0,
    ) -> None:
        self.store = store
        self.client = client
        self.org_max_running = org_max_running
        self.task_queue = task_queue
        self.worker_heartbeat_s = worker_heartbeat_s

    async def wake_ready_children(self) -> int:
        """Signal the waiting chain children whose parents have all succeeded: the parent's
        attempt wakes them as it settles, but a worker killed right after its commit does not."""
        woken = 0
        for job_id in await self.store.chains.ready_to_wake():
            if await self._signal(job_id, PARENTS_CHANGED):
                woken += 1
        return woken

    async def wake_slot_waiters(self) -> int:
        """Signal the jobs waiting for a running slot of their org, as many per org as it has
        free (projections/admission.py). The slot is taken by the job's next attempt, in its
        own transaction; a woken job that finds it gone meanwhile just waits again. "Free" by
        the limit the workers admit by: the configured one within the org's fair part of the
        live fleet (waking by the configured limit alone would wake an org's waiters on every
        pass, to be refused again, and their retries would crowd the other orgs' jobs out of
        the workers' free slots)."""
        limit = self.org_max_running
        if self.task_queue is not None:
            since = datetime.now(UTC) - timedelta(seconds=3 * self.worker_heartbeat_s)
            limit = await self.store.default_org_limit(limit, self.task_queue, since)
        return await self._wake_all(await self.store.orgs.slot_waiters(limit))

    async def wake_budget_waiters(self) -> int:
        """Signal the jobs waiting for room in a provider budget, as many of each budget's
        first-ranked as its room now takes (projections/budgets.py). The room is taken by the
        job's next attempt, in its own transaction; a woken job that finds it gone meanwhile
        just waits again."""
        return await self._wake_all(await self.store.budgets.to_wake(datetime.now(UTC)))

    async def wake_spend_waiters(self) -> int:
        """Signal the jobs waiting for room under a spend cap, the longest waiting first, as
        many as its room now takes (projections/spend.py): the cap was raised or removed, or
        calls cost less than they held. The day's turn wakes the others by their timers."""
        return await self._wake_all(await self.store.spend_caps.to_wake(datetime.now(UTC)))

    async def _wake_all(self, waiters: list[str]) -> int:
        woken = 0
        for first in range(0, len(waiters), WAKE_CONCURRENCY):
            batch = waiters[first : first + WAKE_CONCURRENCY]
            sent = await asyncio.gather(*(self._signal(job_id, SLOT_FREED) for job_id in batch))
            woken += sum(sent)
        return woken

    async def _signal(self, job_id: str, signal: str) -> bool:
        """Whether the job's workflow took the signal (False: it is gone)."""
        handle = self.client.get_workflow_handle(job_id)
        return await unless_gone(handle.signal(signal)) is not GONE
