"""The job store: one handle on the projection for the API, the services and the CLI, made
of its writes (projections/writes.py), reads (reads.py) and the dispatcher's scans (scans.py),
over one session factory and the projector that owns transitions."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.projector import Projector
from projections.reads import JobReads
from projections.scans import DispatchScans
from projections.writes import JobWrites


class JobStore(JobWrites, JobReads, DispatchScans):
    def __init__(self, sessions: async_sessionmaker[AsyncSession], projector: Projector) -> None:
        self.sessions = sessions
        self.projector = projector
