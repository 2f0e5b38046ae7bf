"""`promptjobs budgets …`: provider budgets (requests and tokens a minute per provider and
model, shared by every worker), for operators."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from projections.budgets import BudgetStanding
from promptjobs.console import CliError, console, counted, emit_json, run, table
from promptjobs.settings import Settings
from promptjobs.wiring import open_projection

budgets_app = typer.Typer(
    rich_markup_mode=None,
    help="Provider budgets: requests and tokens a minute per provider and model.",
    no_args_is_help=True,
)

# As long as the budgets table's name column.
MAX_NAME_LENGTH = 200


def register(app: typer.Typer) -> None:
    app.add_typer(budgets_app, name="budgets")


def standing_json(budget: BudgetStanding) -> dict[str, Any]:
    """One budget as `budgets list --json` and `status --json` print it."""
    return {
        "budget": budget.name,
        "rpm": budget.rpm,
        "tpm": budget.tpm,
        "limits_from": "operator"
        if budget.own_rpm or budget.own_tpm
        else "provider"
        if budget.learned_rpm or budget.learned_tpm
        else None,
        "learned_rpm": budget.learned_rpm,
        "learned_tpm": budget.learned_tpm,
        "requests_last_minute": budget.requests,
        "tokens_last_minute": budget.tokens,
        "tokens_reserved": budget.reserved,
        "waiting": budget.waiting,
        "paused_until": None
        if budget.paused_until is None
        else budget.paused_until.isoformat().replace("+00:00", "Z"),
        "rate_limited": budget.rate_limited,
    }


def budgets_table(budgets: list[BudgetStanding]) -> Any:
    columns = ("budget", "requests/min", "tokens/min", "reserved", "waiting", "paused", "429s")

    def used(spent: int, limit: int | None) -> str:
        return f"{spent} of {limit}" if limit else f"{spent} (no limit)"

    cells = (
        [
            b.name,
            used(b.requests, b.rpm),
            used(b.tokens + b.reserved, b.tpm),
            b.reserved,
            b.waiting,
            f"until {b.paused_until:%H:%M:%S}" if b.paused_until else "",
            b.rate_limited,
        ]
        for b in budgets
    )
    return table(counted(len(budgets), "provider budget"), columns, cells)


async def fetch_budgets(settings: Settings) -> list[BudgetStanding]:
    async with open_projection(settings, streams=False, create=False) as projection:
        return await projection.store.budgets.standing(datetime.now(UTC))


@budgets_app.command("list")
def budgets_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Each budget: its limits (the operator's, else the provider's), what the last minute
    spent and reserved, the jobs waiting for it, a 429's pause, and the 429s received."""
    budgets = run(fetch_budgets(Settings()))
    if as_json:
        emit_json([standing_json(b) for b in budgets])
        return
    console().print(budgets_table(budgets))


@budgets_app.command("set")
def budgets_set(
    name: Annotated[str, typer.Argument(help="provider/model, e.g. openai/gpt-4o-mini")],
    rpm: Annotated[int | None, typer.Option(min=1, help="Requests a minute")] = None,
    tpm: Annotated[int | None, typer.Option(min=1, help="Tokens a minute")] = None,
    learned: Annotated[
        bool, typer.Option("--learned", help="Drop the operator's limits: the provider's apply")
    ] = False,
) -> None:
    """Set a budget's limits for every worker, in place of what the provider's rate-limit
    headers teach (set them lower to leave room for other users of the same key). Each call
    sets both: one left out falls back to what the provider teaches."""
    if "/" not in name or not name.strip("/") or len(name) > MAX_NAME_LENGTH:
        raise CliError(f"a budget is named provider/model (at most {MAX_NAME_LENGTH} characters)")
    if learned == (rpm is not None or tpm is not None):
        raise CliError("give --rpm and/or --tpm, or --learned, not both")
    settings = Settings()

    async def apply() -> None:
        async with open_projection(settings, streams=False, create=False) as projection:
            await projection.store.budgets.set_limits(name, rpm, tpm, datetime.now(UTC))

    run(apply())
    if learned:
        typer.echo(f"{name}: the provider's own limits apply (as its headers say)")
    else:
        said = [f"{rpm} requests" if rpm else "", f"{tpm} tokens" if tpm else ""]
        typer.echo(f"{name}: at most {' and '.join(filter(None, said))} a minute, fleet-wide")
