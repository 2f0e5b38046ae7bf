"""The gatherer: deferrable jobs into provider batches (issue 33).

Each worker process runs it. A pass claims the waiting deferrable jobs of each provider and
model as batches (projections/provider_batches.py: a full one at once, a smaller one once
its oldest job has waited `max_wait_s`) and starts each batch's workflow, whose id is the
batch's: a second start of the same batch is harmless, and a batch whose claiming process
died before its start is started by the next pass. A batch not over whose workflow is (an
operator terminated it) is started again: the new run goes on from what the batch recorded."""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from projections.models import ProviderBatch
from projections.store import JobStore
from services.passes import ThrottledLog, first_line
from workflows.contracts import ProviderBatchInput
from workflows.provider_batch import ProviderBatchWorkflow

log = logging.getLogger("promptjobs.batching")

# A claimed batch not started after this long was left by a process that died: start it.
ORPHAN_AFTER_S = 30.0


class BatchGatherer:
    def __init__(
        self,
        store: JobStore,
        client: Client,
        *,
        task_queue: str,
        max_jobs: int,
        max_wait_s: float,
        poll_s: float,
    ) -> None:
        self.batches = store.provider_batches
        self.client = client
        self.task_queue = task_queue
        self.max_jobs = max_jobs
        self.max_wait_s = max_wait_s
        self.poll_s = poll_s
        # Often enough that a batch leaves close to its age, rarely enough to cost nothing.
        self.interval_s = min(5.0, max(0.2, max_wait_s / 4))
        # How often the batches not over are checked for a workflow that is.
        self.revive_every_s = max(2.0, min(600.0, 10 * poll_s))
        self.failures = ThrottledLog(log)

    async def run(self, *, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        revived_at = loop.time()
        while not stop.is_set():
            try:
                await self.gather_once()
                if loop.time() - revived_at >= self.revive_every_s:
                    revived_at = loop.time()
                    await self.revive_once()
            except Exception as err:
                self.failures.warning(
                    "gather", "gathering provider batches failed: %s", first_line(err)
                )
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                pass

    async def gather_once(self) -> int:
        """Claim the batches that are due and start them (and any left unstarted)."""
        made = await self.batches.gather(self.max_jobs, self.max_wait_s)
        for batch in made + await self.batches.unstarted(ORPHAN_AFTER_S):
            await self.start(batch)
        return len(made)

    async def revive_once(self) -> int:
        """Start again the workflow of a batch that is not over while its workflow is
        (terminated by hand, or gone with Temporal's data): the new run goes on from what the
        batch recorded (its provider id: nothing is sent twice)."""
        revived = 0
        for batch in await self.batches.unfinished():
            try:
                status = (await self.client.get_workflow_handle(batch.batch_id).describe()).status
            except RPCError as err:
                if err.status is not RPCStatusCode.NOT_FOUND:
                    raise
                status = None
            if status is WorkflowExecutionStatus.RUNNING:
                continue
            log.warning(
                "provider batch %s: its workflow is %s; starting it again",
                batch.batch_id,
                "gone" if status is None else status.name.lower(),
            )
            await self.start(batch, again=True)
            revived += 1
        return revived

    async def start(self, batch: ProviderBatch, *, again: bool = False) -> None:
        try:
            await self.client.start_workflow(
                ProviderBatchWorkflow.run,
                ProviderBatchInput(batch.batch_id, poll_s=self.poll_s),
                id=batch.batch_id,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE
                if again
                else WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                static_summary=f"provider batch: {batch.jobs} deferrable job(s) of "
                f"{batch.provider} {batch.model}",
            )
        except WorkflowAlreadyStartedError:
            pass
        log.info(
            "provider batch %s: %d job(s) of %s %s",
            batch.batch_id,
            batch.jobs,
            batch.provider,
            batch.model,
        )
        await self.batches.update(batch.batch_id, workflow_started=True)
