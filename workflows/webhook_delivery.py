"""WebhookDeliveryWorkflow: one webhook delivery, tried until the receiver answers 2xx or
about three days have passed (docs/webhooks.md).

Its id is the delivery's (`evt_…`), so a start repeated by the process that committed it and
by the dispatcher's scan starts it once. Each try is an activity; Temporal's retry policy is
the schedule: 5 s, then three times longer each time up to 6 h apart, for three days (about
15 tries). A worker killed mid-try, a restarted Temporal or a receiver down for hours loses
nothing: the next try comes when it is due, with the same `webhook-id` and body."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.webhooks import WebhookActivities
    from workflows.contracts import WebhookDeliveryInput

# The delivery schedule: Standard Webhooks' exponential backoff (up to the input's longest
# wait, 6 h unless set), bounded by three days.
BACKOFF = 3.0
FOR = timedelta(days=3)
# The records around a try, besides the receiver's own timeouts.
RECORDS = timedelta(seconds=10)


@workflow.defn
class WebhookDeliveryWorkflow:
    @workflow.run
    async def run(self, delivery: WebhookDeliveryInput) -> str:
        tries = RetryPolicy(
            initial_interval=timedelta(seconds=delivery.first_retry_s),
            backoff_coefficient=BACKOFF,
            maximum_interval=timedelta(seconds=delivery.longest_wait_s),
        )
        one_try = timedelta(seconds=delivery.timeout_s) + RECORDS
        try:
            outcome: str = await workflow.execute_activity_method(
                WebhookActivities.deliver_webhook,
                delivery.delivery_id,
                start_to_close_timeout=one_try,
                schedule_to_close_timeout=FOR,
                retry_policy=tries,
            )
            return outcome
        except ActivityError:
            await workflow.execute_activity_method(
                WebhookActivities.webhook_gave_up,
                delivery.delivery_id,
                start_to_close_timeout=one_try,
            )
            return "failed"
