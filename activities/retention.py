"""The retention schedule's activity: `jobs archive` in batches, heartbeating between them,
then the files, `/v1/batches`, provider batches and webhook deliveries of the same
age."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import activity

from activities.contracts import ArchiveExpired, ArchiveReport
from projections.operations import Operations


class RetentionActivities:
    def __init__(self, operations: Operations) -> None:
        self.operations = operations

    @activity.defn(name="archive_expired")
    async def archive_expired(self, request: ArchiveExpired) -> ArchiveReport:
        """Remove every terminal job finished more than `retention_days` ago, a batch per
        transaction so that job writes interleave; a retried run resumes where one ended,
        since each batch is committed on its own."""
        before = datetime.now(UTC) - timedelta(days=request.retention_days)
        done = await self.operations.archive_in_batches(
            before=before,
            batch=request.batch,
            progress=lambda so_far: activity.heartbeat(so_far.jobs),
        )
        stored = await self.operations.archive_storage(before=before)
        return ArchiveReport(
            jobs=done.jobs,
            events=done.events,
            prompts=done.prompts,
            responses=done.responses,
            before=before.isoformat(),
            files=stored.files,
            batches=stored.batches,
            provider_batches=stored.provider_batches,
            webhook_deliveries=stored.webhook_deliveries,
        )
