"""Webhooks: each org's endpoints, and the outbox of deliveries.

A delivery is written in the transaction of the state change it tells of (`enqueue`, from
the projector's `transition`): if the change commits, so does the promise to tell each
endpoint that wants it; if it rolls back, nothing is sent. Each delivery is then sent by a
workflow of its own (workflows/webhook_delivery.py), started by the process that committed it
or by the dispatcher's scan of the undispatched ones, so a process that dies after its commit
loses nothing. Its id is the `webhook-id` every try carries (receivers dedupe by it), and its
body is fixed when the event happens: every try sends the same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import threading
import uuid
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.errors import Refused
from projections.domain.lifecycle import JobState
from projections.errors import NotFound
from projections.event_log import prepared, utcnow
from projections.group_commit import GroupCommit, WriteTx, dialect_insert
from projections.models import (
    Base,
    BatchLine,
    Job,
    Prompt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSigning,
)
from projections.rows import job_row

ENDPOINTS = Base.metadata.tables[WebhookEndpoint.__tablename__]
DELIVERIES = Base.metadata.tables[WebhookDelivery.__tablename__]
SIGNING = Base.metadata.tables[WebhookSigning.__tablename__]
PROMPTS = Base.metadata.tables[Prompt.__tablename__]
BATCH_LINES = Base.metadata.tables[BatchLine.__tablename__]

# A job's end, as each endpoint may ask for it; `job.running` (its first attempt began) only
# where an endpoint names it.
JOB_ENDS = ("job.succeeded", "job.failed", "job.cancelled", "job.superseded")
JOB_RUNNING = "job.running"
# The objects of the OpenAI routes, by OpenAI's own names and payloads: a background
# response's end (POST /v1/responses with background) and a batch's (/v1/batches).
RESPONSE_ENDS = (
    "response.completed",
    "response.failed",
    "response.cancelled",
    "response.incomplete",
)
BATCH_ENDS = ("batch.completed", "batch.failed", "batch.cancelled", "batch.expired")
ENDS = (*JOB_ENDS, *RESPONSE_ENDS, *BATCH_ENDS)
EVENT_TYPES = (*ENDS, JOB_RUNNING)
# The events a job's own webhook may ask for (its submission's `webhook_events`).
JOB_EVENT_TYPES = (*JOB_ENDS, JOB_RUNNING)
# The endpoint id under which an org's jobs' own webhooks are kept and seen
# (`/v1/webhooks/default/…`, as Replicate names the secret that signs them).
JOB_WEBHOOKS = "default"
# A response cut at its token limit is `incomplete` to OpenAI (api/openai/responses.py).
CUT_SHORT = frozenset({"length", "max_tokens"})
RESPONSE_OUTCOMES = {
    JobState.SUCCEEDED: "completed",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
}
# A response's id is its prompt's (`pmt_…`) under OpenAI's prefix (api/openai/responses.py).
RESPONSE_PREFIX = "resp_"
# How long the previous secret signs too after a rotation, unless said otherwise.
ROTATION_OVERLAP = timedelta(hours=24)
# How many endpoints an org may have.
MAX_ENDPOINTS = 20

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def new_secret() -> str:
    """A signing secret as the Standard Webhooks specification writes one: `whsec_` and the
    base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def rotated(secret: str, overlap: timedelta, now: datetime) -> dict[str, Any]:
    """A rotation's new values: a new secret, and `secret` signing too until `overlap` ends
    (an endpoint's, or an org's for its jobs' own webhooks)."""
    return {"secret": new_secret(), "previous_secret": secret, "previous_until": now + overlap}


def new_delivery_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


class TooManyEndpoints(Refused, ValueError):
    code = "too_many_endpoints"

    def __init__(self) -> None:
        super().__init__(
            f"your organisation has its {MAX_ENDPOINTS} webhook endpoints: delete one first"
        )


class Outbox:
    """Tells this process's starters that a transaction committed deliveries: each watching
    starter's event is set (from the writer's thread, once the commit is done), so a starter
    sleeps until there is something to start instead of looking every few milliseconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[asyncio.Event, asyncio.AbstractEventLoop] = {}

    def watch(self, event: asyncio.Event) -> None:
        """Set `event` (of the running loop) at each commit of deliveries."""
        with self._lock:
            self._watchers[event] = asyncio.get_running_loop()

    def unwatch(self, event: asyncio.Event) -> None:
        with self._lock:
            self._watchers.pop(event, None)

    def written(self) -> None:
        with self._lock:
            watchers = list(self._watchers.items())
        for event, loop in watchers:
            with suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(event.set)


OUTBOX = Outbox()


def job_event(job: Job, target: JobState) -> str | None:
    """The webhook event a job's transition to `target` is, if any."""
    if target.is_terminal:
        return f"job.{target.value}"
    if target is JobState.RUNNING and job.attempt == 1:
        return JOB_RUNNING
    return None


def wants(events: list[str], event: str) -> bool:
    return event in events if events else event in ENDS


def _endpoints(tx: WriteTx, org: str) -> list[tuple[str, list[str]]]:
    """The org's enabled endpoints, and the events each wants."""
    endpoints = prepared(
        tx,
        ("webhook endpoints of org",),
        lambda: select(ENDPOINTS.c.endpoint_id, ENDPOINTS.c.events).where(
            ENDPOINTS.c.org == bindparam("org"), ENDPOINTS.c.disabled_at.is_(None)
        ),
    )
    return [(row["endpoint_id"], row["events"]) for row in endpoints.rows(tx, {"org": org})]


def tell_job(
    tx: WriteTx, job: Job, target: JobState, now: datetime, *, finish_reason: str | None = None
) -> int:
    """The deliveries a job's transition to `target` makes, in its transaction (how many).
    A background response of the OpenAI routes ends as OpenAI names it (`response.…`, its
    payload's `data` the response's id); any other job as `job.…`, with the job's row."""
    event = job_event(job, target)
    if event is None:
        return 0
    told = 0
    data: dict[str, Any] = {}
    if job.webhook is not None and wants(job.webhook_events or [], event):
        # The job's own webhook: its job events, whatever route made it.
        data = {"id": job.job_id, **job_row(job)}
        told += enqueue(tx, job.org, event, data, now, job.job_id, [JOB_WEBHOOKS], job.webhook)
    endpoints = _endpoints(tx, job.org)
    if not endpoints:
        return told  # the usual case: one indexed read, nothing more
    data = data or {"id": job.job_id, **job_row(job)}
    if target in RESPONSE_OUTCOMES and _background_response(tx, job.prompt_id):
        outcome = RESPONSE_OUTCOMES[target]
        if target is JobState.SUCCEEDED and finish_reason in CUT_SHORT:
            outcome = "incomplete"
        event, data = f"response.{outcome}", {"id": RESPONSE_PREFIX + job.prompt_id[4:]}
    wanting = [endpoint_id for endpoint_id, events in endpoints if wants(events, event)]
    if event.startswith("job.") and _batch_line(tx, job.prompt_id):
        # A /v1/batches line is told by its batch's end, as OpenAI does; an endpoint that
        # names job events gets its jobs' too.
        wanting = [endpoint_id for endpoint_id, events in endpoints if event in events]
    return told + enqueue(tx, job.org, event, data, now, job.job_id, wanting)


def _batch_line(tx: WriteTx, prompt_id: str) -> bool:
    found = select(BATCH_LINES.c.line).where(BATCH_LINES.c.prompt_id == prompt_id).limit(1)
    return tx.execute(found).first() is not None


def _background_response(tx: WriteTx, prompt_id: str) -> bool:
    """Whether the prompt is a background response of the OpenAI routes."""
    kept = tx.execute(select(PROMPTS.c.openai).where(PROMPTS.c.prompt_id == prompt_id)).scalar()
    return isinstance(kept, dict) and bool(kept.get("background"))


def tell_batch(tx: WriteTx, org: str, batch_id: str, status: str, now: datetime) -> int:
    """A `/v1/batches` batch's end (`batch.completed`, …), as OpenAI sends it."""
    return enqueue(tx, org, f"batch.{status}", {"id": batch_id}, now)


def enqueue(
    tx: WriteTx,
    org: str,
    event: str,
    data: dict[str, Any],
    now: datetime,
    job_id: str | None = None,
    endpoints: list[str] | None = None,
    url: str | None = None,
) -> int:
    """A delivery of `event` to each of the org's endpoints that wants it (`endpoints`, if
    read already; [JOB_WEBHOOKS] with `url`: a job's own webhook), in the transaction of the
    change it tells of (how many)."""
    if endpoints is None:
        endpoints = [e for e, events in _endpoints(tx, org) if wants(events, event)]
    for endpoint_id in endpoints:
        delivery_id = new_delivery_id()
        body = {
            "id": delivery_id,
            "object": "event",
            "type": event,
            "created_at": int(now.timestamp()),
            "data": data,
        }
        tx.execute(
            insert(DELIVERIES),
            {
                "delivery_id": delivery_id,
                "endpoint_id": endpoint_id,
                "org": org,
                "event_type": event,
                "job_id": job_id,
                "payload": json.dumps(body, separators=(",", ":"), default=str),
                "url": url,
                "state": PENDING,
                "attempts": 0,
                "created_at": now,
            },
        )
    if endpoints:
        # Once committed (a starter that looked before the commit would find nothing).
        tx.after_commit.append(OUTBOX.written)
    return len(endpoints)


@dataclass(frozen=True)
class ToSend:
    """One delivery as its next try sends it: its body, where it goes, and its secrets (its
    endpoint's, or for a job's own webhook its org's)."""

    delivery: WebhookDelivery
    endpoint: WebhookEndpoint | None  # None: deleted meanwhile, or a job's own webhook
    signing: WebhookSigning | None = None  # a job's own webhook: its org's secrets

    @property
    def url(self) -> str | None:
        """Where it goes; None: its endpoint was deleted."""
        if self.delivery.url is not None:
            return self.delivery.url
        return None if self.endpoint is None else self.endpoint.url

    def secrets(self, now: datetime) -> list[str]:
        """The secrets that sign it now, and the previous one while a rotation overlaps."""
        keys = self.signing if self.delivery.url is not None else self.endpoint
        assert keys is not None
        found = [keys.secret]
        previous, until = keys.previous_secret, keys.previous_until
        if previous is not None and until is not None and until > now:
            found.append(previous)
        return found


class Webhooks:
    """The webhook endpoints and deliveries as stored (`JobStore.webhooks`)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    # -- endpoints ----------------------------------------------------------------------

    async def create(
        self, org: str, url: str, events: list[str], description: str | None
    ) -> WebhookEndpoint:
        now = utcnow()
        row = {
            "endpoint_id": f"we_{uuid.uuid4().hex[:24]}",
            "org": org,
            "url": url,
            "events": events,
            "description": description,
            "secret": new_secret(),
            "created_at": now,
            "updated_at": now,
        }

        def write(tx: WriteTx) -> None:
            count = select(func.count()).where(ENDPOINTS.c.org == org)
            if tx.execute(count).scalar_one() >= MAX_ENDPOINTS:
                raise TooManyEndpoints()
            tx.execute(insert(ENDPOINTS), row)

        await self.writes.run(write)
        return WebhookEndpoint(
            **row, previous_secret=None, previous_until=None, disabled_at=None, disabled_reason=None
        )

    async def listed(self, org: str) -> list[WebhookEndpoint]:
        async with self.sessions() as session:
            stmt = (
                select(WebhookEndpoint)
                .where(WebhookEndpoint.org == org)
                .order_by(WebhookEndpoint.created_at, WebhookEndpoint.endpoint_id)
            )
            return list((await session.execute(stmt)).scalars())

    async def get(self, org: str, endpoint_id: str) -> WebhookEndpoint:
        async with self.sessions() as session:
            found = await session.get(WebhookEndpoint, endpoint_id)
        if found is None or found.org != org:
            raise NotFound("webhook endpoint", endpoint_id)
        return found

    async def update(self, org: str, endpoint_id: str, **changes: Any) -> WebhookEndpoint:
        """Change its url, events, description, or enable it again (`enabled=True`)."""
        values = {k: v for k, v in changes.items() if k in ("url", "events", "description")}
        if changes.get("enabled") is True:
            values.update(disabled_at=None, disabled_reason=None)
        elif changes.get("enabled") is False:
            values.update(disabled_at=utcnow(), disabled_reason="disabled by the org")
        await self._change(org, endpoint_id, values)
        return await self.get(org, endpoint_id)

    async def rotate(
        self, org: str, endpoint_id: str, overlap: timedelta = ROTATION_OVERLAP
    ) -> WebhookEndpoint:
        """A new secret; the old one keeps signing too for `overlap`."""
        current = await self.get(org, endpoint_id)
        await self._change(org, endpoint_id, rotated(current.secret, overlap, utcnow()))
        return await self.get(org, endpoint_id)

    async def delete(self, org: str, endpoint_id: str) -> None:
        """Remove it; its pending deliveries end `failed` (their workflows find it gone)."""
        await self.get(org, endpoint_id)

        def write(tx: WriteTx) -> None:
            tx.execute(delete(ENDPOINTS).where(ENDPOINTS.c.endpoint_id == endpoint_id))
            tx.execute(
                update(DELIVERIES)
                .where(DELIVERIES.c.endpoint_id == endpoint_id, DELIVERIES.c.state == PENDING)
                .values(state=FAILED, last_error="its endpoint was deleted")
            )

        await self.writes.run(write)

    async def disable(self, endpoint_id: str, reason: str) -> None:
        def write(tx: WriteTx) -> None:
            tx.execute(
                update(ENDPOINTS)
                .where(ENDPOINTS.c.endpoint_id == endpoint_id, ENDPOINTS.c.disabled_at.is_(None))
                .values(disabled_at=utcnow(), disabled_reason=reason[:1000], updated_at=utcnow())
            )

        await self.writes.run(write)

    # -- the org's secret for its jobs' own webhooks ------------------------------------

    async def signing(self, org: str) -> WebhookSigning:
        """The org's secret for its jobs' own webhooks, made at its first use."""
        async with self.sessions() as session:
            found = await session.get(WebhookSigning, org)
        if found is not None:
            return found
        now = utcnow()
        row = {"org": org, "secret": new_secret(), "created_at": now, "updated_at": now}

        def write(tx: WriteTx) -> None:
            # Two first uses at once: one secret, the first written.
            first = dialect_insert(SIGNING, postgresql=tx.postgresql).values(row)
            tx.execute(first.on_conflict_do_nothing())

        await self.writes.run(write)
        async with self.sessions() as session:
            made = await session.get(WebhookSigning, org)
        assert made is not None
        return made

    async def rotate_signing(
        self, org: str, overlap: timedelta = ROTATION_OVERLAP
    ) -> WebhookSigning:
        """A new secret for the org's jobs' own webhooks; the old one signs too for `overlap`."""
        current = await self.signing(org)
        now = utcnow()
        values = {**rotated(current.secret, overlap, now), "updated_at": now}

        def write(tx: WriteTx) -> None:
            tx.execute(update(SIGNING).where(SIGNING.c.org == org).values(values))

        await self.writes.run(write)
        return await self.signing(org)

    async def _own(self, org: str, endpoint_id: str) -> None:
        """Raise NotFound unless `endpoint_id` is one of the org's endpoints, or JOB_WEBHOOKS."""
        if endpoint_id != JOB_WEBHOOKS:
            await self.get(org, endpoint_id)

    async def _change(self, org: str, endpoint_id: str, values: dict[str, Any]) -> None:
        def write(tx: WriteTx) -> int:
            done = tx.execute(
                update(ENDPOINTS)
                .where(ENDPOINTS.c.endpoint_id == endpoint_id, ENDPOINTS.c.org == org)
                .values(**values, updated_at=utcnow())
            )
            return int(done.rowcount)

        if not await self.writes.run(write):
            raise NotFound("webhook endpoint", endpoint_id)

    # -- deliveries ---------------------------------------------------------------------

    async def deliveries(
        self, org: str, endpoint_id: str, limit: int = 100, state: str | None = None
    ) -> list[WebhookDelivery]:
        """The endpoint's deliveries (JOB_WEBHOOKS: those to the org's jobs' own webhooks),
        newest first."""
        await self._own(org, endpoint_id)
        stmt = (
            select(WebhookDelivery)
            .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.org == org)
            .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.delivery_id.desc())
            .limit(limit)
        )
        if state is not None:
            stmt = stmt.where(WebhookDelivery.state == state)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def redeliver(
        self, org: str, endpoint_id: str, *, since: datetime | None, delivery_id: str | None
    ) -> list[str]:
        """Send again one delivery, or every failed one since `since`: pending again, each
        started anew by the dispatcher (same id, same body)."""
        await self._own(org, endpoint_id)

        def write(tx: WriteTx) -> list[str]:
            which = select(DELIVERIES.c.delivery_id).where(
                DELIVERIES.c.endpoint_id == endpoint_id, DELIVERIES.c.org == org
            )
            if delivery_id is not None:
                which = which.where(DELIVERIES.c.delivery_id == delivery_id)
            else:
                which = which.where(DELIVERIES.c.state == FAILED)
                if since is not None:
                    which = which.where(DELIVERIES.c.created_at >= since)
            ids = list(tx.execute(which).scalars())
            if ids:
                tx.execute(
                    update(DELIVERIES)
                    .where(DELIVERIES.c.delivery_id.in_(ids))
                    .values(state=PENDING, dispatched_at=None, last_error=None)
                )
                tx.after_commit.append(OUTBOX.written)
            return ids

        found = await self.writes.run(write)
        if delivery_id is not None and not found:
            raise NotFound("webhook delivery", delivery_id)
        return found

    async def undispatched(self, limit: int) -> list[tuple[str, str]]:
        """Deliveries whose workflow was not started yet, oldest first: id and org."""
        async with self.sessions() as session:
            stmt = (
                select(DELIVERIES.c.delivery_id, DELIVERIES.c.org)
                .where(DELIVERIES.c.dispatched_at.is_(None), DELIVERIES.c.state == PENDING)
                .order_by(DELIVERIES.c.created_at)
                .limit(limit)
            )
            return [(delivery_id, org) for delivery_id, org in await session.execute(stmt)]

    async def dispatched(self, delivery_ids: list[str]) -> None:
        def write(tx: WriteTx) -> None:
            tx.execute(
                update(DELIVERIES)
                .where(DELIVERIES.c.delivery_id.in_(delivery_ids))
                .values(dispatched_at=utcnow())
            )

        await self.writes.run(write)

    async def to_send(self, delivery_id: str) -> ToSend | None:
        async with self.sessions() as session:
            delivery = await session.get(WebhookDelivery, delivery_id)
            if delivery is None:
                return None
            if delivery.url is None:
                return ToSend(delivery, await session.get(WebhookEndpoint, delivery.endpoint_id))
        return ToSend(delivery, None, await self.signing(delivery.org))

    async def tried(
        self,
        delivery_id: str,
        *,
        status: int | None,
        error: str | None,
        state: str = PENDING,
    ) -> None:
        """One try's outcome: its status code or error, and the delivery's state after."""
        now = utcnow()
        values: dict[str, Any] = {
            "attempts": DELIVERIES.c.attempts + 1,
            "last_status": status,
            "last_error": None if error is None else error[:1000],
            "last_attempt_at": now,
            "state": state,
        }
        if state == DELIVERED:
            values["delivered_at"] = now

        def write(tx: WriteTx) -> None:
            tx.execute(
                update(DELIVERIES).where(DELIVERIES.c.delivery_id == delivery_id).values(values)
            )

        await self.writes.run(write)

    async def delivered_since(self, endpoint_id: str, since: datetime) -> bool:
        """Whether any delivery reached the endpoint since `since`."""
        stmt = (
            select(DELIVERIES.c.delivery_id)
            .where(
                DELIVERIES.c.endpoint_id == endpoint_id,
                DELIVERIES.c.delivered_at >= since,
            )
            .limit(1)
        )
        async with self.sessions() as session:
            return (await session.execute(stmt)).first() is not None

    async def gave_up(self, delivery_id: str, why: str) -> None:
        def write(tx: WriteTx) -> None:
            tx.execute(
                update(DELIVERIES)
                .where(DELIVERIES.c.delivery_id == delivery_id, DELIVERIES.c.state == PENDING)
                .values(state=FAILED, last_error=why[:1000])
            )

        await self.writes.run(write)
