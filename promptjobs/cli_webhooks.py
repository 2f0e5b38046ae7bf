"""`promptjobs webhooks …`: an org's webhook endpoints and their deliveries, for operators
(the same as an admin key's /v1/webhooks; docs/webhooks.md)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from projections.models import WebhookDelivery, WebhookEndpoint
from projections.webhooks import EVENT_TYPES, JOB_WEBHOOKS
from promptjobs.console import CliError, console, counted, emit_json, iso, run, table
from promptjobs.settings import Settings
from promptjobs.wiring import open_projection

webhooks_app = typer.Typer(
    rich_markup_mode=None,
    help="Webhook endpoints of an org, and their deliveries.",
    no_args_is_help=True,
)

OrgOpt = Annotated[str, typer.Option(help="The organisation")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON")]
EventsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--event",
        help=f"An event type it wants (repeat); none: every end. {', '.join(EVENT_TYPES)}",
    ),
]


def register(app: typer.Typer) -> None:
    app.add_typer(webhooks_app, name="webhooks")


def _endpoint(e: WebhookEndpoint, secret: bool = False) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "endpoint_id": e.endpoint_id,
        "org": e.org,
        "url": e.url,
        "events": list(e.events),
        "description": e.description,
        "enabled": e.disabled_at is None,
        "disabled_reason": e.disabled_reason,
        "created_at": iso(e.created_at),
    }
    if secret:
        shown["secret"] = e.secret
    return shown


def _delivery(d: WebhookDelivery) -> dict[str, Any]:
    return {
        "delivery_id": d.delivery_id,
        "event_type": d.event_type,
        "job_id": d.job_id,
        "url": d.url,
        "state": d.state,
        "attempts": d.attempts,
        "last_status": d.last_status,
        "last_error": d.last_error,
        "created_at": iso(d.created_at),
        "last_attempt_at": iso(d.last_attempt_at),
        "delivered_at": iso(d.delivered_at),
    }


def _events(given: list[str] | None) -> list[str]:
    unknown = [e for e in given or () if e not in EVENT_TYPES]
    if unknown:
        raise CliError(f"unknown event type {unknown[0]!r}: one of {', '.join(EVENT_TYPES)}")
    return list(given or ())


def _act(action: Any) -> Any:
    """Run `action(store)` on the projection (a refusal is one line, as any: cli.main)."""

    async def go() -> Any:
        async with open_projection(Settings(), streams=False, create=False) as projection:
            return await action(projection.store)

    return run(go())


@webhooks_app.command("list")
def webhooks_list(org: OrgOpt, as_json: JsonOpt = False) -> None:
    """The org's endpoints (never their secrets)."""
    found = [_endpoint(e) for e in _act(lambda store: store.webhooks.listed(org))]
    if as_json:
        emit_json(found)
        return
    columns = ("endpoint_id", "url", "events", "enabled", "disabled_reason")
    cells = (
        [
            e["endpoint_id"],
            e["url"],
            ", ".join(e["events"]) or "every end",
            e["enabled"],
            e["disabled_reason"] or "",
        ]
        for e in found
    )
    console().print(table(counted(len(found), "endpoint"), columns, cells))


@webhooks_app.command("create")
def webhooks_create(
    url: Annotated[str, typer.Argument(help="Where deliveries go (a public address)")],
    org: OrgOpt,
    event: EventsOpt = None,
    description: Annotated[str | None, typer.Option(help="What it is for")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Register an endpoint; its signing secret is printed once."""
    from promptjobs.runtime import allowed_webhooks
    from services.webhooks import check_webhook_url

    events = _events(event)

    async def create(store: Any) -> WebhookEndpoint:
        await check_webhook_url(url, allowed_webhooks(Settings()))
        made: WebhookEndpoint = await store.webhooks.create(org, url, events, description)
        return made

    made = _act(create)
    if as_json:
        emit_json(_endpoint(made, secret=True))
        return
    typer.echo(
        f"{made.endpoint_id}: {url} (org {org})\nsecret {made.secret}\n(shown once, keep it)"
    )


@webhooks_app.command("update")
def webhooks_update(
    endpoint_id: Annotated[str, typer.Argument(help="The endpoint")],
    org: OrgOpt,
    url: Annotated[str | None, typer.Option(help="A new URL")] = None,
    event: EventsOpt = None,
    enable: Annotated[
        bool | None, typer.Option("--enable/--disable", help="Send to it, or stop")
    ] = None,
) -> None:
    """Change an endpoint's URL or events, or enable (disable) it."""
    from promptjobs.runtime import allowed_webhooks
    from services.webhooks import check_webhook_url

    changes: dict[str, Any] = {}
    if url is not None:
        changes["url"] = url
    if event:
        changes["events"] = _events(event)
    if enable is not None:
        changes["enabled"] = enable
    if not changes:
        raise CliError("give --url, --event or --enable/--disable")

    async def update(store: Any) -> WebhookEndpoint:
        if url is not None:
            await check_webhook_url(url, allowed_webhooks(Settings()))
        done: WebhookEndpoint = await store.webhooks.update(org, endpoint_id, **changes)
        return done

    done = _act(update)
    state = "enabled" if done.disabled_at is None else f"disabled ({done.disabled_reason})"
    typer.echo(f"{endpoint_id}: {done.url}, {state}")


@webhooks_app.command("delete")
def webhooks_delete(
    endpoint_id: Annotated[str, typer.Argument(help="The endpoint")], org: OrgOpt
) -> None:
    """Remove an endpoint; its deliveries not yet made end failed."""
    _act(lambda store: store.webhooks.delete(org, endpoint_id))
    typer.echo(f"deleted {endpoint_id}")


@webhooks_app.command("rotate")
def webhooks_rotate(
    endpoint_id: Annotated[str, typer.Argument(help=f"The endpoint, or {JOB_WEBHOOKS!r}")],
    org: OrgOpt,
    overlap_s: Annotated[
        int, typer.Option(min=0, help="How long the old secret signs too")
    ] = 86_400,
) -> None:
    """A new signing secret, printed once; the old one keeps signing too for --overlap-s.
    `default`: the secret of the org's jobs' own webhooks."""
    overlap = timedelta(seconds=overlap_s)
    if endpoint_id == JOB_WEBHOOKS:
        secret = _act(lambda store: store.webhooks.rotate_signing(org, overlap)).secret
    else:
        secret = _act(lambda store: store.webhooks.rotate(org, endpoint_id, overlap)).secret
    typer.echo(f"secret {secret}\n(shown once; the previous one signs too for {overlap_s} s)")


@webhooks_app.command("secret")
def webhooks_secret(org: OrgOpt) -> None:
    """The secret that signs the org's jobs' own webhooks (a submission's `webhook`); made
    at its first use. Their deliveries: `promptjobs webhooks deliveries default`."""
    typer.echo(_act(lambda store: store.webhooks.signing(org)).secret)


@webhooks_app.command("deliveries")
def webhooks_deliveries(
    endpoint_id: Annotated[
        str, typer.Argument(help=f"The endpoint, or {JOB_WEBHOOKS!r}: jobs' own webhooks")
    ],
    org: OrgOpt,
    state: Annotated[str | None, typer.Option(help="pending, delivered or failed")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """An endpoint's deliveries, newest first: state, tries, last status and error."""
    if state not in (None, "pending", "delivered", "failed"):
        raise CliError(f"--state is pending, delivered or failed, not {state!r}")
    found = [
        _delivery(d)
        for d in _act(lambda store: store.webhooks.deliveries(org, endpoint_id, limit, state))
    ]
    if as_json:
        emit_json(found)
        return
    columns = (
        "delivery_id",
        "event_type",
        "state",
        "attempts",
        "last_status",
        "last_error",
        "created_at",
    )
    cells = ([d[c] if d[c] is not None else "" for c in columns] for d in found)
    console().print(table(counted(len(found), "delivery"), columns, cells))


@webhooks_app.command("redeliver")
def webhooks_redeliver(
    endpoint_id: Annotated[
        str, typer.Argument(help=f"The endpoint, or {JOB_WEBHOOKS!r}: jobs' own webhooks")
    ],
    org: OrgOpt,
    delivery: Annotated[str | None, typer.Option(help="One delivery (evt_…) to send again")] = None,
    since: Annotated[
        datetime | None, typer.Option(help="Else every failed one since (UTC)")
    ] = None,
) -> None:
    """Send deliveries again (the same webhook-id and body); the dispatcher starts them."""
    from datetime import UTC

    when = None if since is None else (since if since.tzinfo else since.replace(tzinfo=UTC))
    ids = _act(
        lambda store: store.webhooks.redeliver(org, endpoint_id, since=when, delivery_id=delivery)
    )
    typer.echo(f"{len(ids)} deliver{'y' if len(ids) == 1 else 'ies'} to send again")
