"""`promptjobs orgs …`: each org's share of the fleet (its running limit), for operators."""

from __future__ import annotations

from typing import Annotated

import typer

from projections.admission import OrgShare
from promptjobs.console import CliError, console, emit_json, run, table
from promptjobs.settings import Settings
from promptjobs.wiring import open_projection

orgs_app = typer.Typer(help="Organisations' running limits.", no_args_is_help=True)

# As long as the jobs table's org column.
MAX_ORG_LENGTH = 64


def register(app: typer.Typer) -> None:
    app.add_typer(orgs_app, name="orgs")


@orgs_app.command("list")
def orgs_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Orgs with jobs in flight or a limit of their own: running, waiting for a slot, limit."""
    settings = Settings()

    async def fetch() -> list[OrgShare]:
        async with open_projection(settings, streams=False, create=False) as projection:
            return await projection.store.orgs.shares(settings.org_max_running)

    rows = [
        {
            "org": share.org,
            "running": share.running,
            "waiting": share.waiting,
            "limit": share.limit or None,
            "limit_from": "org" if share.own_limit else "PROMPTJOBS_ORG_MAX_RUNNING",
        }
        for share in run(fetch())
    ]
    if as_json:
        emit_json(rows)
        return
    columns = ("org", "running", "waiting", "limit", "limit_from")
    cells = (
        [row["org"], row["running"], row["waiting"], row["limit"] or "none", row["limit_from"]]
        for row in rows
    )
    console().print(table(f"{len(rows)} orgs", columns, cells))


@orgs_app.command("limit")
def orgs_limit(
    org: Annotated[str, typer.Argument(help="The organisation")],
    max_running: Annotated[
        int | None,
        typer.Argument(help="Jobs it may run at once (0: no limit); omit with --default"),
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Back to PROMPTJOBS_ORG_MAX_RUNNING")
    ] = False,
) -> None:
    """Set an org's own running limit. Every worker applies it at the next admission; jobs
    already running keep their slots."""
    if (max_running is None) == (not default):
        raise CliError("give a limit (0 for none) or --default, not both")
    if max_running is not None and max_running < 0:
        raise CliError(f"the limit must be 0 or more, not {max_running}")
    if not org or len(org) > MAX_ORG_LENGTH or "\x00" in org:
        raise CliError(f"an org name is 1 to {MAX_ORG_LENGTH} characters")
    settings = Settings()

    async def apply() -> None:
        async with open_projection(settings, streams=False, create=False) as projection:
            await projection.store.orgs.set_limit(org, max_running)

    run(apply())
    if max_running is None:
        typer.echo(f"{org}: back to the default limit ({settings.org_max_running or 'none'})")
    else:
        typer.echo(f"{org}: at most {max_running or 'unlimited'} jobs running at once")
