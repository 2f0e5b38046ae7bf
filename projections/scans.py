"""The dispatcher's scans: committed jobs whose workflow is not started, cancels not yet
delivered, and unsettled rows to compare with their workflows."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.lifecycle import UNSETTLED, JobState
from projections.models import Job


class DispatchScans:
    sessions: async_sessionmaker[AsyncSession]

    async def undispatched(self, limit: int = 200) -> list[Job]:
        async with self.sessions() as session:
            stmt = (
                select(Job)
                .where(Job.dispatched_at.is_(None), Job.state == JobState.QUEUED)
                .order_by(Job.created_at)
                .limit(limit)
            )
            return list((await session.execute(stmt)).scalars())

    async def pending_cancels(self, limit: int = 200) -> list[Job]:
        async with self.sessions() as session:
            stmt = (
                select(Job)
                .where(
                    Job.cancel_requested_at.is_not(None),
                    Job.dispatched_at.is_not(None),
                    Job.state.in_(UNSETTLED),
                )
                .limit(limit)
            )
            return list((await session.execute(stmt)).scalars())

    async def unsettled_before(self, before: datetime, limit: int = 200) -> list[Job]:
        async with self.sessions() as session:
            stmt = (
                select(Job)
                .where(
                    Job.dispatched_at.is_not(None),
                    Job.state.in_(UNSETTLED),
                    Job.updated_at < before,
                )
                .order_by(Job.updated_at)
                .limit(limit)
            )
            return list((await session.execute(stmt)).scalars())
