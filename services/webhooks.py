"""Starting webhook deliveries' workflows (workflows/webhook_delivery.py), and checking an
endpoint's URL at registration.

The outbox's deliveries commit with the state changes they tell of; a `WebhookStarter` in the
process that committed them starts their workflows at once (`projections.webhooks.OUTBOX`
says a transaction wrote some), and the dispatcher's scan starts any a process left behind
(it died after its commit). The workflow's id is the delivery's: two starts start it once."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import Priority, WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from activities.webhooks import AddressRefused, Allowed, WebhookActivities, resolve
from projections.domain.errors import Refused
from projections.errors import database_unavailable
from projections.store import JobStore
from projections.webhooks import OUTBOX
from services.priority import fairness_key
from workflows.contracts import WebhookDeliveryInput
from workflows.webhook_delivery import WebhookDeliveryWorkflow

log = logging.getLogger("promptjobs.webhooks")

# Deliveries started per read of the undispatched.
PAGE = 200
# How long a starter remembers the deliveries it marked started (a read in flight meanwhile
# may still find them unstarted; one begun after the mark does not).
FORGET_STARTED_S = 60.0


class InvalidWebhookUrl(Refused, ValueError):
    code = "invalid_webhook_url"


async def check_webhook_url(url: str, allowed: Allowed, *, field: str = "url") -> None:
    """Raise InvalidWebhookUrl (naming the body's `field`) unless deliveries may go to `url`
    (resolved now; resolved again, and pinned, at each try)."""
    try:
        await resolve(url, allowed)
    except AddressRefused as err:
        raise InvalidWebhookUrl(f"{field}: {err}") from err


class WebhookStarter:
    def __init__(
        self,
        store: JobStore,
        client: Client,
        task_queue: str,
        first_retry_s: float = 5.0,
        longest_wait_s: float = 6 * 3600.0,
        *,
        timeout_s: float = 10.0,
        sender: WebhookActivities | None = None,
    ) -> None:
        self.store = store
        self.client = client
        self.task_queue = task_queue
        self.first_retry_s = first_retry_s
        self.longest_wait_s = longest_wait_s
        self.timeout_s = timeout_s
        # Where set, each delivery's first try is made here and now, while its workflow
        # (started with its first try put off by `first_retry_s`) is the durable rest.
        self.sender = sender
        self._trying: set[asyncio.Task[None]] = set()
        # Deliveries whose first try is made and whose workflow is being started.
        self._starting: set[str] = set()
        # When each was marked started (monotonic): a read that began before then may still
        # have found it unstarted.
        self._started: dict[str, float] = {}

    async def start_pending(self) -> int:
        """Start the workflow of every delivery not started yet; how many."""
        started = 0
        while found := await self.store.webhooks.undispatched(PAGE):
            await self._start_all(found)
            started += len(found)
            if len(found) < PAGE:
                break
        return started

    async def _start_all(self, found: list[tuple[str, str]]) -> None:
        await asyncio.gather(*(self._start(delivery_id, org) for delivery_id, org in found))
        await self.store.webhooks.dispatched([delivery_id for delivery_id, _ in found])

    async def try_new(self) -> int:
        """Make the first try of each delivery not started yet at once, and start their
        workflows meanwhile (the next look does not wait for those starts: a delivery
        committed during them is tried as soon)."""
        began = time.monotonic()
        found = [
            (delivery_id, org)
            for delivery_id, org in await self.store.webhooks.undispatched(PAGE)
            if delivery_id not in self._starting and self._started.get(delivery_id, 0) < began
        ]
        self._forget_started(began - FORGET_STARTED_S)
        for delivery_id, _ in found:
            self._starting.add(delivery_id)
            self._try_now(delivery_id)
        task = asyncio.create_task(self._start_all(found))
        self._trying.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._trying.discard(task)
            now = time.monotonic()
            for delivery_id, _ in found:
                self._starting.discard(delivery_id)
                self._started[delivery_id] = now
            if not task.cancelled() and task.exception() is not None:
                OUTBOX.written()  # look again; the dispatcher's scan is the last resort
                log.warning("starting webhook deliveries failed, will retry: %r", task.exception())

        task.add_done_callback(done)
        if len(found) == PAGE:
            OUTBOX.written()  # more where these came from
        return len(found)

    def _forget_started(self, before: float) -> None:
        for delivery_id in [d for d, at in self._started.items() if at < before]:
            del self._started[delivery_id]

    def _try_now(self, delivery_id: str) -> None:
        """The first try, at once, beside the workflow's start: the moment a job ends is not
        spent waiting for Temporal to start a workflow and hand its activity to a worker. A
        try that fails (or a process that dies meanwhile) leaves the delivery to its
        workflow, which finds it delivered, or tries it again."""
        if self.sender is None:
            return
        # It may wait for its endpoint's turn as long as its workflow's first try is put off.
        attempt = self.sender.deliver(delivery_id, wait_s=self.first_retry_s)
        task = asyncio.create_task(self._quietly(attempt))
        self._trying.add(task)
        task.add_done_callback(self._trying.discard)

    @staticmethod
    async def _quietly(attempt: Any) -> None:
        try:
            await attempt
        except Exception as err:  # the workflow tries again; the try is recorded
            log.debug("a first try of a webhook failed: %r", err)

    async def _start(self, delivery_id: str, org: str) -> None:
        # Its first try is made at once by the process that committed it (this one, or
        # another whose start the dispatcher's scan raced): the workflow's own waits as a
        # retry would, so the two do not both send it at the same moment.
        delay = timedelta(seconds=self.first_retry_s)
        await self.client.start_workflow(
            WebhookDeliveryWorkflow.run,
            WebhookDeliveryInput(
                delivery_id, self.first_retry_s, self.longest_wait_s, self.timeout_s
            ),
            id=delivery_id,
            task_queue=self.task_queue,
            # A redelivery starts it again under the same id; a repeated start joins it.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # Ahead of every job's work on the task queue (a delivery is a moment's), the
            # orgs taking turns: a backlog of jobs, or one org's flood, does not delay it.
            priority=Priority(priority_key=1, fairness_key=fairness_key(org)),
            start_delay=delay,
        )

    async def run(self, *, stop: asyncio.Event) -> None:
        """Start deliveries as soon as this process commits them, until `stop`."""
        written = asyncio.Event()
        OUTBOX.watch(written)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                woken = asyncio.ensure_future(written.wait())
                await asyncio.wait([woken, stopping], return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if stop.is_set():
                    break
                written.clear()
                try:
                    await self.try_new()
                except Exception as err:
                    # The dispatcher's scan starts what is left; say why once in a while.
                    if not database_unavailable(err):
                        log.warning("starting webhook deliveries failed, will retry: %r", err)
                    await asyncio.sleep(1.0)
                    written.set()
        finally:
            stopping.cancel()
            OUTBOX.unwatch(written)
