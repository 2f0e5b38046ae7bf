"""The dispatcher's scans: committed jobs whose workflow is not started, cancels not yet
delivered, and unsettled rows to compare with their workflows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.lifecycle import UNSETTLED, JobState
from projections.models import Job


class DispatchScans:
    sessions: async_sessionmaker[AsyncSession]

    async def undispatched(self, limit: int = 200, after: Job | None = None) -> list[Job]:
        """Jobs whose workflow start is not recorded, oldest first; `after` is the last job
        of the previous page. Running ones too: a start may have reached Temporal (an
        attempt runs) without its record, and a second start of the same id is harmless."""
        stmt = select(Job).where(Job.dispatched_at.is_(None), Job.state.in_(UNSETTLED))
        return await self._page(
            stmt, Job.created_at, limit, after.created_at if after else None, after
        )

    async def pending_cancels(self, limit: int = 200, after: Job | None = None) -> list[Job]:
        """Cancel requests not yet delivered to a started workflow. A cancelled row too: the
        API cancelled it before its start was recorded, and the workflow must hear it."""
        stmt = select(Job).where(
            Job.cancel_requested_at.is_not(None),
            Job.dispatched_at.is_not(None),
            Job.state.in_([*UNSETTLED, JobState.CANCELLED]),
        )
        return await self._page(
            stmt, Job.created_at, limit, after.created_at if after else None, after
        )

    async def unsettled_before(
        self, before: datetime, limit: int = 200, after: Job | None = None
    ) -> list[Job]:
        stmt = select(Job).where(
            Job.dispatched_at.is_not(None),
            Job.state.in_(UNSETTLED),
            Job.updated_at < before,
        )
        return await self._page(
            stmt, Job.updated_at, limit, after.updated_at if after else None, after
        )

    async def _page(
        self,
        stmt: Select[Any],
        key: Any,
        limit: int,
        after_key: datetime | None,
        after: Job | None,
    ) -> list[Job]:
        """One page of a scan in (`key`, job id) order, after the previous page's last job."""
        if after is not None and after_key is not None:
            stmt = stmt.where(
                or_(key > after_key, and_(key == after_key, Job.job_id > after.job_id))
            )
        async with self.sessions() as session:
            page = stmt.order_by(key, Job.job_id).limit(limit)
            return list((await session.execute(page)).scalars())
