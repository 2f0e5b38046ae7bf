"""ProviderBatchWorkflow: one provider batch of deferrable jobs, from its send to its end.

Send it once (the activity adopts a batch sent before under the same id, so a worker lost
mid-send does not send it twice), poll it on a durable timer until the provider ends it,
then settle each job from its own line and tell each job's workflow (BATCH_DONE). A worker
crash, a redeploy or a Temporal restart resumes it where it was (docs/providers.md)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.contracts import (
        BatchPoll,
        BatchSent,
        BatchSettled,
        ProviderBatchRef,
    )
    from activities.provider_batches import BatchActivities
    from workflows.contracts import ProviderBatchInput

# A provider call of the batch's: retried until it lands (the provider being down is not the
# batch's failure); the jobs' own ceilings bound the wait.
PROVIDER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2), maximum_interval=timedelta(minutes=5)
)
CALL_TIMEOUT = timedelta(minutes=5)
# Settling a batch reads its result files and writes each job: long for a big one; it
# heartbeats as it goes.
SETTLE_TIMEOUT = timedelta(hours=1)
SETTLE_HEARTBEAT = timedelta(minutes=2)


@workflow.defn
class ProviderBatchWorkflow:
    def __init__(self) -> None:
        self._status = "gathered"

    @workflow.query
    def status(self) -> str:
        return self._status

    @workflow.run
    async def run(self, batch: ProviderBatchInput) -> BatchSettled:
        ref = ProviderBatchRef(batch.batch_id)
        sent: BatchSent = await workflow.execute_activity_method(
            BatchActivities.submit_provider_batch,
            ref,
            start_to_close_timeout=CALL_TIMEOUT,
            retry_policy=PROVIDER_RETRY,
        )
        if sent.provider_batch_id is None:
            self._status = "not sent: " + ("no job left" if sent.empty else sent.direct)
            workflow.set_current_details(self._status)
            return BatchSettled()
        self._show(f"sent as {sent.provider_batch_id}")
        while True:
            await workflow.sleep(timedelta(seconds=batch.poll_s))
            poll: BatchPoll = await workflow.execute_activity_method(
                BatchActivities.poll_provider_batch,
                ref,
                start_to_close_timeout=CALL_TIMEOUT,
                retry_policy=PROVIDER_RETRY,
            )
            self._show(f"{poll.status} ({sent.provider_batch_id})")
            if poll.ended:
                break
        settled: BatchSettled = await workflow.execute_activity_method(
            BatchActivities.settle_provider_batch,
            ref,
            start_to_close_timeout=SETTLE_TIMEOUT,
            heartbeat_timeout=SETTLE_HEARTBEAT,
            retry_policy=PROVIDER_RETRY,
        )
        self._show(
            f"ended {poll.status}: {settled.settled} job(s) settled, "
            f"{settled.direct} sent to run directly"
        )
        return settled

    def _show(self, status: str) -> None:
        self._status = status
        workflow.set_current_details(status)
