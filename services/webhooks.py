"""Starting webhook deliveries' workflows (workflows/webhook_delivery.py), and checking an
endpoint's URL at registration.

The outbox's deliveries commit with the state changes they tell of; a `WebhookStarter` in the
process that committed them starts their workflows at once (`projections.webhooks.OUTBOX`
says a transaction wrote some), and the dispatcher's scan starts any a process left behind
(it died after its commit). The workflow's id is the delivery's: two starts start it once."""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from activities.webhooks import AddressRefused, Allowed, resolve
from projections.domain.errors import Refused
from projections.errors import database_unavailable
from projections.store import JobStore
from projections.webhooks import OUTBOX
from workflows.webhook_delivery import WebhookDeliveryInput, WebhookDeliveryWorkflow

log = logging.getLogger("promptjobs.webhooks")

# Deliveries started per read of the undispatched.
PAGE = 200
# How often the starter looks whether this process wrote deliveries.
LOOK_S = 0.02


class InvalidWebhookUrl(Refused, ValueError):
    code = "invalid_webhook_url"


async def check_webhook_url(url: str, allowed: Allowed) -> None:
    """Raise InvalidWebhookUrl unless deliveries may go to `url` (resolved now; resolved
    again, and pinned, at each try)."""
    try:
        await resolve(url, allowed)
    except AddressRefused as err:
        raise InvalidWebhookUrl(f"url: {err}") from err


class WebhookStarter:
    def __init__(
        self, store: JobStore, client: Client, task_queue: str, first_retry_s: float = 5.0
    ) -> None:
        self.store = store
        self.client = client
        self.task_queue = task_queue
        self.first_retry_s = first_retry_s

    async def start_pending(self) -> int:
        """Start the workflow of every delivery not started yet; how many."""
        started = 0
        while ids := await self.store.webhooks.undispatched(PAGE):
            await asyncio.gather(*(self._start(delivery_id) for delivery_id in ids))
            await self.store.webhooks.dispatched(ids)
            started += len(ids)
            if len(ids) < PAGE:
                break
        return started

    async def _start(self, delivery_id: str) -> None:
        await self.client.start_workflow(
            WebhookDeliveryWorkflow.run,
            WebhookDeliveryInput(delivery_id, self.first_retry_s),
            id=delivery_id,
            task_queue=self.task_queue,
            # A redelivery starts it again under the same id; a repeated start joins it.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    async def run(self, *, stop: asyncio.Event) -> None:
        """Start deliveries as soon as this process commits them, until `stop`."""
        while not stop.is_set():
            if OUTBOX.take():
                try:
                    await self.start_pending()
                except Exception as err:
                    # The dispatcher's scan starts what is left; say why once in a while.
                    if not database_unavailable(err):
                        log.warning("starting webhook deliveries failed, will retry: %r", err)
                    OUTBOX.written()
                    await asyncio.sleep(1.0)
            try:
                await asyncio.wait_for(stop.wait(), LOOK_S)
            except TimeoutError:
                pass
