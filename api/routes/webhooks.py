"""/v1/webhooks: an org's webhook endpoints and their deliveries (admin keys only;
docs/webhooks.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import Caller, ContextDep
from api.problems import Problem, problem_responses
from api.schemas import (
    DeliveryList,
    DeliveryOut,
    Redelivered,
    RedeliverIn,
    RotateIn,
    SigningSecret,
    WebhookChange,
    WebhookIn,
    WebhookList,
    WebhookOut,
    WebhookWithSecret,
)
from projections.models import WebhookEndpoint, WebhookSigning
from projections.scope import Scope
from services.webhooks import check_webhook_url

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


def _admin(caller: Scope) -> str:
    if caller.author is not None:
        raise Problem(
            403,
            "forbidden",
            "Admins only",
            "webhook endpoints are the organisation's: use an admin key",
        )
    return caller.org


def _out(endpoint: WebhookEndpoint) -> WebhookOut:
    return WebhookOut(
        endpoint_id=endpoint.endpoint_id,
        url=endpoint.url,
        events=list(endpoint.events),
        description=endpoint.description,
        enabled=endpoint.disabled_at is None,
        disabled_reason=endpoint.disabled_reason,
        created_at=endpoint.created_at,
        updated_at=endpoint.updated_at,
    )


def _with_secret(endpoint: WebhookEndpoint) -> WebhookWithSecret:
    return WebhookWithSecret(**_out(endpoint).model_dump(), secret=endpoint.secret)


@router.post(
    "",
    status_code=201,
    response_model=WebhookWithSecret,
    responses=problem_responses(401, 403, 422),
)
async def create_webhook(body: WebhookIn, caller: Caller, ctx: ContextDep) -> WebhookWithSecret:
    """Register an endpoint; its signing secret is in this answer only (and a rotation's).
    The URL must resolve to a public address (checked now, and again at every try)."""
    org = _admin(caller)
    await check_webhook_url(body.url, ctx.webhooks_allowed)
    made = await ctx.store.webhooks.create(org, body.url, list(body.events), body.description)
    return _with_secret(made)


@router.get("", response_model=WebhookList, responses=problem_responses(401, 403))
async def list_webhooks(caller: Caller, ctx: ContextDep) -> WebhookList:
    org = _admin(caller)
    return WebhookList(data=[_out(e) for e in await ctx.store.webhooks.listed(org)])


def _secret(signing: WebhookSigning) -> SigningSecret:
    return SigningSecret(key=signing.secret, previous_until=signing.previous_until)


@router.get("/default/secret", response_model=SigningSecret, responses=problem_responses(401))
async def job_webhooks_secret(caller: Caller, ctx: ContextDep) -> SigningSecret:
    """The secret that signs your org's jobs' own webhooks (a submission's `webhook`), as
    Replicate's route names it; any key of the org may read it, to verify what it asked for.
    Their deliveries are at `/v1/webhooks/default/deliveries` (admins)."""
    return _secret(await ctx.store.webhooks.signing(caller.org))


@router.post(
    "/default/rotate",
    response_model=SigningSecret,
    responses=problem_responses(401, 403, 422),
)
async def rotate_job_webhooks_secret(
    caller: Caller, ctx: ContextDep, body: RotateIn | None = None
) -> SigningSecret:
    """A new secret for the org's jobs' own webhooks; the previous one keeps signing too
    for `overlap_s`."""
    overlap = timedelta(seconds=(body or RotateIn()).overlap_s)
    return _secret(await ctx.store.webhooks.rotate_signing(_admin(caller), overlap))


@router.get("/{endpoint_id}", response_model=WebhookOut, responses=problem_responses(401, 403, 404))
async def get_webhook(endpoint_id: str, caller: Caller, ctx: ContextDep) -> WebhookOut:
    return _out(await ctx.store.webhooks.get(_admin(caller), endpoint_id))


@router.patch(
    "/{endpoint_id}", response_model=WebhookOut, responses=problem_responses(401, 403, 404, 422)
)
async def update_webhook(
    endpoint_id: str, body: WebhookChange, caller: Caller, ctx: ContextDep
) -> WebhookOut:
    """Change its URL, events or description, or enable (or disable) it."""
    org = _admin(caller)
    if body.url is not None:
        await check_webhook_url(body.url, ctx.webhooks_allowed)
    changes = body.model_dump(exclude_none=True)
    return _out(await ctx.store.webhooks.update(org, endpoint_id, **changes))


@router.delete("/{endpoint_id}", status_code=204, responses=problem_responses(401, 403, 404))
async def delete_webhook(endpoint_id: str, caller: Caller, ctx: ContextDep) -> Response:
    """Remove it; its deliveries not yet made end `failed`."""
    await ctx.store.webhooks.delete(_admin(caller), endpoint_id)
    return Response(status_code=204)


@router.post(
    "/{endpoint_id}/rotate",
    response_model=WebhookWithSecret,
    responses=problem_responses(401, 403, 404, 422),
)
async def rotate_webhook_secret(
    endpoint_id: str, caller: Caller, ctx: ContextDep, body: RotateIn | None = None
) -> WebhookWithSecret:
    """A new signing secret; the previous one keeps signing too (a second signature in
    `webhook-signature`) for `overlap_s`, so receivers can switch without missing one."""
    overlap = timedelta(seconds=(body or RotateIn()).overlap_s)
    rotated = await ctx.store.webhooks.rotate(_admin(caller), endpoint_id, overlap)
    return _with_secret(rotated)


@router.get(
    "/{endpoint_id}/deliveries",
    response_model=DeliveryList,
    responses=problem_responses(401, 403, 404, 422),
)
async def list_deliveries(
    endpoint_id: str,
    caller: Caller,
    ctx: ContextDep,
    state: Annotated[str | None, Query(pattern="^(pending|delivered|failed)$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DeliveryList:
    """Its deliveries, newest first: state, tries, the last status code and error.
    `default`: the deliveries to the org's jobs' own webhooks."""
    found = await ctx.store.webhooks.deliveries(_admin(caller), endpoint_id, limit, state)
    return DeliveryList(data=[DeliveryOut.model_validate(d) for d in found])


@router.post(
    "/{endpoint_id}/redeliver",
    response_model=Redelivered,
    status_code=202,
    responses=problem_responses(401, 403, 404, 422),
)
async def redeliver(
    endpoint_id: str, body: RedeliverIn, caller: Caller, ctx: ContextDep
) -> Redelivered:
    """Send one delivery again (`delivery_id`), or every failed one since `since`: the same
    `webhook-id` and body, tried anew by the same schedule."""
    ids = await ctx.store.webhooks.redeliver(
        _admin(caller), endpoint_id, since=body.since, delivery_id=body.delivery_id
    )
    return Redelivered(delivery_ids=ids)
