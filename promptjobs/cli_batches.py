"""`promptjobs provider-batches …`: the provider batches deferrable jobs run in (issue 33),
and the deferrable jobs still waiting to be gathered, for operators."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from projections.models import ProviderBatch
from promptjobs.console import console, counted, emit_json, run, table
from promptjobs.settings import Settings
from promptjobs.wiring import open_projection

batches_app = typer.Typer(
    rich_markup_mode=None,
    help="Provider batches: deferrable jobs sent to a provider's batch API.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(batches_app, name="provider-batches")


def _time(value: Any) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def batch_json(batch: ProviderBatch) -> dict[str, Any]:
    return {
        "batch_id": batch.batch_id,
        "provider": batch.provider,
        "model": batch.model,
        "jobs": batch.jobs,
        "state": batch.state,
        "provider_batch_id": batch.provider_batch_id,
        "provider_status": batch.provider_status,
        "note": batch.note,
        "unreadable_lines": batch.unreadable_lines,
        "duplicate_lines": batch.duplicate_lines,
        "created_at": _time(batch.created_at),
        "sent_at": _time(batch.sent_at),
        "ended_at": _time(batch.ended_at),
    }


async def fetch(settings: Settings, limit: int) -> tuple[list[ProviderBatch], list[Any]]:
    async with open_projection(settings, streams=False, create=False) as projection:
        store = projection.store.provider_batches
        return await store.recent(limit), await store.waiting()


@batches_app.command("list")
def batches_list(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Newest batches shown")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """The newest provider batches (their jobs, state, the provider's id and status), and
    the deferrable jobs still waiting to be gathered, per provider and model."""
    batches, waiting = run(fetch(Settings(), limit))
    if as_json:
        emit_json(
            {
                "batches": [batch_json(b) for b in batches],
                "waiting": [{"provider": p, "model": m, "jobs": n} for p, m, n in waiting],
            }
        )
        return
    columns = ("batch", "provider/model", "jobs", "state", "provider batch", "status", "created")
    cells = (
        [
            b.batch_id,
            f"{b.provider}/{b.model}",
            b.jobs,
            b.state,
            b.provider_batch_id or "",
            " ".join(
                [b.provider_status or (b.note or "")[:60]]
                + ([f"({b.unreadable_lines} unreadable line(s))"] if b.unreadable_lines else [])
                + ([f"({b.duplicate_lines} repeated line(s))"] if b.duplicate_lines else [])
            ),
            f"{b.created_at:%Y-%m-%d %H:%M:%S}",
        ]
        for b in batches
    )
    out = console()
    out.print(table(f"{counted(len(batches), 'provider batch')}, newest first", columns, cells))
    for provider, model, jobs in waiting:
        out.print(f"waiting to be gathered: {jobs} job(s) of {provider}/{model}")
