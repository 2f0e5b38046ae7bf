"""The webhook outbox in the projection: a job's transition writes a delivery for each of its
org's endpoints that wants the event, in the same transaction; signatures verify under the
current secret and, while a rotation overlaps, under the previous one; a delivery whose tries
are over disables an endpoint nothing reached for days."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import standardwebhooks
from temporalio.testing import ActivityEnvironment

from activities.webhooks import WebhookActivities, signed_headers
from projections.domain.lifecycle import JobState
from projections.projector import Transition
from projections.scope import Scope
from projections.webhooks import OUTBOX
from projections.writes import Submission
from promptjobs.wiring import Projection

ACME = Scope("acme", "alice", "member")


async def test_a_jobs_changes_write_deliveries_for_the_endpoints_that_want_them(
    projection: Projection,
) -> None:
    hooks = projection.store.webhooks
    every_end = await hooks.create("acme", "https://example.com/a", [], None)
    running_only = await hooks.create("acme", "https://example.com/b", ["job.running"], None)
    await hooks.create("initech", "https://example.com/c", [], None)
    written = asyncio.Event()
    OUTBOX.watch(written)
    job = (await projection.store.submit(ACME, Submission("hi", 50, 3, {}))).job
    assert not written.is_set()

    try:
        await projection.projector.start_attempt(job.job_id, 1, "worker-1")
        await projection.projector.apply(Transition(job.job_id, JobState.FAILED, 1))
        # The process's starter is told once the commit is done.
        await asyncio.wait_for(written.wait(), 5)
    finally:
        OUTBOX.unwatch(written)

    ends = await hooks.deliveries("acme", every_end.endpoint_id)
    assert [d.event_type for d in ends] == ["job.failed"]
    body = json.loads(ends[0].payload)
    assert (body["id"], body["type"], body["object"]) == (
        ends[0].delivery_id,
        "job.failed",
        "event",
    )
    assert body["data"]["job_id"] == job.job_id and body["data"]["state"] == "failed"
    started = await hooks.deliveries("acme", running_only.endpoint_id)
    assert [d.event_type for d in started] == ["job.running"]
    assert len(await hooks.undispatched(100)) == 2  # nothing for the other org's endpoint


async def test_both_secrets_sign_while_a_rotation_overlaps(projection: Projection) -> None:
    hooks = projection.store.webhooks
    made = await hooks.create("acme", "https://example.com/a", [], None)
    rotated = await hooks.rotate("acme", made.endpoint_id, timedelta(hours=1))
    body = b'{"id":"evt_1"}'
    now = int(datetime.now(UTC).timestamp())
    headers = signed_headers([rotated.secret, made.secret], "evt_1", now, body)
    for secret in (made.secret, rotated.secret):
        assert standardwebhooks.Webhook(secret).verify(body, headers) == {"id": "evt_1"}


async def test_an_endpoint_nothing_reached_for_days_is_disabled_when_a_delivery_gives_up(
    projection: Projection,
) -> None:
    hooks = projection.store.webhooks
    dead = await hooks.create("acme", "https://example.com/dead", [], None)
    alive = await hooks.create("acme", "https://example.com/alive", [], None)
    job = (await projection.store.submit(ACME, Submission("hi", 50, 3, {}))).job
    await projection.projector.apply(Transition(job.job_id, JobState.CANCELLED))
    [to_dead] = await hooks.deliveries("acme", dead.endpoint_id)
    [to_alive] = await hooks.deliveries("acme", alive.endpoint_id)
    later = (await projection.store.submit(ACME, Submission("hi", 50, 3, {}))).job
    await projection.projector.apply(Transition(later.job_id, JobState.CANCELLED))
    delivered = (await hooks.deliveries("acme", alive.endpoint_id))[0]
    await hooks.tried(delivered.delivery_id, status=200, error=None, state="delivered")

    activities = WebhookActivities(projection.store)
    for delivery in (to_dead, to_alive):
        await ActivityEnvironment().run(activities.webhook_gave_up, delivery.delivery_id)

    assert (await hooks.get("acme", dead.endpoint_id)).disabled_at is not None
    reason = (await hooks.get("acme", dead.endpoint_id)).disabled_reason
    assert "nothing delivered since" in str(reason)
    # Something reached the other since its delivery was made: a bad event, not a dead endpoint.
    assert (await hooks.get("acme", alive.endpoint_id)).disabled_at is None
    states = {d.delivery_id: d.state for d in await hooks.deliveries("acme", dead.endpoint_id)}
    assert states[to_dead.delivery_id] == "failed"


def test_the_api_names_exactly_the_event_types_the_outbox_makes() -> None:
    from typing import get_args

    from api.schemas import JobWebhookEvent, WebhookEvent
    from projections.webhooks import EVENT_TYPES, JOB_EVENT_TYPES

    assert set(get_args(WebhookEvent)) == set(EVENT_TYPES)
    assert set(get_args(JobWebhookEvent)) == set(JOB_EVENT_TYPES)
