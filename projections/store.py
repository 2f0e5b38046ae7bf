"""The job store: one handle on the projection for the API, the services and the CLI, made
of its writes (projections/writes.py), reads (reads.py) and the dispatcher's scans (scans.py),
over one session factory and the projector that owns transitions. What is not one job's
row has a repository on it: `keys`, `workers`, `chains`, `orgs` (each org's share),
`budgets` (provider budgets), `circuits` (places that fail for everyone), `spend_caps`,
`webhooks` (endpoints and the outbox), `files` and `batches` (OpenAI's Files and Batch APIs),
`provider_batches` (deferrable jobs gathered into providers' batches) and `operations` (the
operator's views and archive). A new
query goes into one of these, never into a free function that takes a session factory
(docs/decisions.md)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.admission import OrgShares, fleet_share
from projections.budgets import Budgets
from projections.chain_store import ChainStore
from projections.circuits import Circuits
from projections.files import FileStore
from projections.keys import KeyStore
from projections.openai_batches import BatchStore
from projections.operations import Operations
from projections.projector import Projector
from projections.provider_batches import ProviderBatches
from projections.reads import JobReads
from projections.scans import DispatchScans
from projections.spend import SpendCaps
from projections.webhooks import Webhooks
from projections.workers import WorkerRegistry
from projections.writes import JobWrites


class JobStore(JobWrites, JobReads, DispatchScans):
    async def default_org_limit(
        self, configured: int, task_queue: str, since: datetime, *, own_slots: int = 0
    ) -> int:
        """The running limit of an org without one of its own: `configured` within its fair
        part of the fleet of workers alive since `since` (admission.fleet_share), counting at
        least `own_slots` (a worker asking knows it is alive, registered yet or not). 0 while
        no worker is known and nothing is configured: no limit. Workers admit by it and the
        dispatcher wakes waiting jobs by it, so the two agree on who has room."""
        slots = max(await self.workers.live_slots(task_queue, since), own_slots)
        orgs = await self.orgs.active() if slots else 0
        return fleet_share(configured, slots, orgs)

    def __init__(self, sessions: async_sessionmaker[AsyncSession], projector: Projector) -> None:
        self.sessions = sessions
        self.projector = projector
        self.keys = KeyStore(sessions, projector.writes)
        self.workers = WorkerRegistry(sessions, projector.writes)
        self.chains = ChainStore(sessions, projector.writes)
        self.orgs = OrgShares(sessions, projector.writes)
        self.budgets = Budgets(sessions, projector.writes, projector.budget_window)
        self.circuits = Circuits(sessions, projector.writes)
        self.spend_caps = SpendCaps(sessions, projector.writes)
        self.webhooks = Webhooks(sessions, projector.writes)
        self.operations = Operations(sessions, projector.writes)
        self.files = FileStore(sessions, projector.writes)
        self.batches = BatchStore(sessions, projector.writes)
        self.provider_batches = ProviderBatches(sessions, projector.writes)
