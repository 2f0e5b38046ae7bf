"""`promptjobs orgs …`: each org's share of the fleet (its running limit), for operators."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from projections.admission import OrgShare
from projections.spend import Caps, CapStanding
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

    async def fetch() -> tuple[list[OrgShare], dict[str, CapStanding], Caps]:
        async with open_projection(settings, streams=False, create=False) as projection:
            shares = await projection.store.orgs.shares(settings.org_max_running)
            caps = projection.store.spend_caps
            standings = await caps.standings(datetime.now(UTC))
            return (
                shares,
                {s.cap.org: s for s in standings if s.cap.key_id is None},
                await caps.caps(),
            )

    shares, capped, caps = run(fetch())
    rows = [
        {
            "org": share.org,
            "running": share.running,
            "waiting": share.waiting,
            "limit": share.limit or None,
            "limit_from": "org" if share.own_limit else "PROMPTJOBS_ORG_MAX_RUNNING",
            "tpm": share.tpm,
            **_cap_fields(capped.get(share.org)),
            "over_cap": (
                None
                if share.org not in capped
                else "refuse"
                if share.org in caps.refusing
                else "wait"
            ),
        }
        for share in shares
    ]
    if as_json:
        emit_json(rows)
        return
    columns = ("org", "running", "waiting", "limit", "limit_from", "tokens/min", "usd/day", "today")
    cells = (
        [
            row["org"],
            row["running"],
            row["waiting"],
            row["limit"] or "none",
            row["limit_from"],
            row["tpm"] or "",
            *cap_cells(capped.get(str(row["org"]))),
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
    usd_per_day: Annotated[
        float | None,
        typer.Option(
            min=0, help="US dollars its jobs may spend in a UTC day, all told (0: no cap)"
        ),
    ] = None,
    over_cap: Annotated[
        str | None,
        typer.Option(
            help="Past the cap, submissions are accepted and wait (wait, the default) or are "
            "refused with 429 insufficient_quota (refuse)"
        ),
    ] = None,
) -> None:
    """Set an org's own running limit, its quota of tokens a minute over every provider
    budget, or its spend cap in US dollars a day. Every worker applies them at the next
    admission (within 2 s for a quota or a cap); jobs already running keep their slots."""
    if max_running is not None and default:
        raise CliError("give a limit (0 for none) or --default, not both")
    if max_running is None and not default and tpm is None and usd_per_day is None:
        if over_cap is None:
            raise CliError("give a limit (0 for none), --default, --tpm N or --usd-per-day N")
    if over_cap not in (None, "wait", "refuse"):
        raise CliError(f"--over-cap is wait or refuse, not {over_cap!r}")
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
            if usd_per_day is not None or over_cap is not None:
                caps = projection.store.spend_caps
                if usd_per_day is None:
                    mine = (await caps.caps()).orgs.get(org)
                    if mine is None:
                        raise CliError(f"{org} has no spend cap: give --usd-per-day N first")
                    await caps.set_org_cap(org, mine.usd_per_day, over_cap)
                else:
                    await caps.set_org_cap(org, usd_per_day or None, over_cap)

    run(apply())
    if default:
        typer.echo(f"{org}: back to the default limit ({settings.org_max_running or 'none'})")
    elif max_running is not None:
        typer.echo(f"{org}: at most {max_running or 'unlimited'} jobs running at once")
    if tpm is not None:
        quota = f"at most {tpm} tokens a minute on provider budgets" if tpm else "no token quota"
        typer.echo(f"{org}: {quota}")
    if usd_per_day is not None or over_cap is not None:
        past = "submissions past it are refused" if over_cap == "refuse" else "jobs past it wait"
        cap = f"at most ${usd_per_day:g} a day" if usd_per_day else "no spend cap"
        shown = cap if usd_per_day == 0 or over_cap is None else f"{cap}; {past}"
        typer.echo(f"{org}: {shown}" if usd_per_day is not None else f"{org}: {past}")


def _cap_fields(standing: CapStanding | None) -> dict[str, float | int | None]:
    """A cap's columns in `orgs list` and `keys list`: the cap, what today spent and holds."""
    if standing is None:
        return {"usd_per_day": None, "spent_today": None, "held": None, "waiting_on_cap": None}
    return {
        "usd_per_day": standing.cap.usd_per_day,
        "spent_today": round(standing.spent, 6),
        "held": round(standing.held, 6),
        "waiting_on_cap": standing.waiting,
    }


def cap_cells(standing: CapStanding | None) -> tuple[str, str]:
    """A cap's cells in `orgs list` and `keys list`: the cap, and what today used of it."""
    if standing is None:
        return "", ""
    waiting = f", {standing.waiting} waiting" if standing.waiting else ""
    return f"${standing.cap.usd_per_day:g}", f"${standing.used:.2f} ({standing.share:.0%}{waiting})"
