"""RetentionWorkflow: one run of the retention schedule (services/retention.py)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.contracts import ArchiveExpired, ArchiveReport


@workflow.defn(name="ArchiveExpiredJobs")
class RetentionWorkflow:
    @workflow.run
    async def run(self, request: ArchiveExpired) -> ArchiveReport:
        report: ArchiveReport = await workflow.execute_activity(
            "archive_expired",
            request,
            result_type=ArchiveReport,
            start_to_close_timeout=timedelta(hours=1),
            heartbeat_timeout=timedelta(minutes=2),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=10),
                maximum_interval=timedelta(minutes=5),
                maximum_attempts=10,
            ),
        )
        return report
