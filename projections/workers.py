"""The worker registry: each worker process records its configuration and heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.models import WorkerProcess


def utcnow() -> datetime:
    return datetime.now(UTC)


class WorkerRegistry:
    """The worker processes' rows (`JobStore.workers`)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def heartbeat(
        self,
        identity: str,
        config: dict[str, Any],
        started_at: datetime,
        *,
        stopped: bool = False,
    ) -> None:
        """Record that `identity` is alive now (or, with `stopped`, that it shut down). Only
        the worker itself writes its row, so a read-then-write cannot race."""
        now = utcnow()
        async with self.sessions() as session, session.begin():
            row = await session.get(WorkerProcess, identity)
            if row is None:
                row = WorkerProcess(identity=identity, started_at=started_at, config=config)
                session.add(row)
            row.heartbeat_at = now
            row.config = config
            row.stopped_at = now if stopped else None

    async def since(self, since: datetime) -> list[WorkerProcess]:
        """Workers that beat since `since`, the most recent first."""
        async with self.sessions() as session:
            rows = await session.execute(
                select(WorkerProcess)
                .where(WorkerProcess.heartbeat_at >= since)
                .order_by(WorkerProcess.heartbeat_at.desc())
            )
            return list(rows.scalars())

    async def live_slots(self, task_queue: str, since: datetime) -> int:
        """The activity slots of the workers on `task_queue` alive since `since` (beating, not
        stopped): the fleet an org's default share is a part of."""
        alive = await self.since(since)
        return sum(
            int(worker.config.get("max_concurrent_activities") or 0)
            for worker in alive
            if worker.stopped_at is None and worker.config.get("task_queue") == task_queue
        )
