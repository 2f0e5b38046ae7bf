"""The worker registry: each worker process records its configuration and heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.group_commit import GroupCommit, WriteTx, dialect_insert
from projections.models import Base, WorkerProcess

WORKERS = Base.metadata.tables[WorkerProcess.__tablename__]


def utcnow() -> datetime:
    return datetime.now(UTC)


class WorkerRegistry:
    """The worker processes' rows (`JobStore.workers`)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

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
        beat = {"heartbeat_at": now, "config": config, "stopped_at": now if stopped else None}

        def write(tx: WriteTx) -> None:
            row = dialect_insert(WORKERS, postgresql=tx.postgresql).values(
                identity=identity, started_at=started_at, **beat
            )
            tx.execute(row.on_conflict_do_update(index_elements=["identity"], set_=beat))

        await self.writes.run(write)

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
