"""`promptjobs orgs …`: each org's share of the fleet (its running limit), for operators."""

from __future__ import annotations

from typing import Annotated

import typer

from projections.admission import OrgShare
from promptjobs.console import CliError, console, counted, emit_json, run, table
from promptjobs.settings import Settings
from promptjobs.wiring import open_projection

orgs_app = typer.Typer(
    rich_markup_mode=None, help="Organisations' running limits.", no_args_is_help=True
)

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
            "tpm": share.tpm,
        }
        for share in run(fetch())
    ]
    if as_json:
        emit_json(rows)
        return
    columns = ("org", "running", "waiting", "limit", "limit_from", "tokens/min")
    cells = (
        [
            row["org"],
            row["running"],
            row["waiting"],
            row["limit"] or "none",
            row["limit_from"],
            row["tpm"] or "",
        ]
        for row in rows
    )
    console().print(table(counted(len(rows), "org"), columns, cells))


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
    tpm: Annotated[
        int | None,
        typer.Option(
            min=0, help="Tokens a minute its calls may draw on provider budgets (0: no quota)"
        ),
    ] = None,
) -> None:
    """Set an org's own running limit, or its quota of tokens a minute over every provider
    budget. Every worker applies them at the next admission (within 2 s for a quota); jobs
    already running keep their slots."""
    if max_running is not None and default:
        raise CliError("give a limit (0 for none) or --default, not both")
    if max_running is None and not default and tpm is None:
        raise CliError("give a limit (0 for none), --default, or --tpm N")
    if max_running is not None and max_running < 0:
        raise CliError(f"the limit must be 0 or more, not {max_running}")
    if not org or len(org) > MAX_ORG_LENGTH or "\x00" in org:
        raise CliError(f"an org name is 1 to {MAX_ORG_LENGTH} characters")
    settings = Settings()

    async def apply() -> None:
        async with open_projection(settings, streams=False, create=False) as projection:
            if max_running is not None or default:
                await projection.store.orgs.set_limit(org, max_running)
            if tpm is not None:
                await projection.store.orgs.set_token_quota(org, tpm or None)

    run(apply())
    if default:
        typer.echo(f"{org}: back to the default limit ({settings.org_max_running or 'none'})")
    elif max_running is not None:
        typer.echo(f"{org}: at most {max_running or 'unlimited'} jobs running at once")
    if tpm is not None:
        quota = f"at most {tpm} tokens a minute on provider budgets" if tpm else "no token quota"
        typer.echo(f"{org}: {quota}")
