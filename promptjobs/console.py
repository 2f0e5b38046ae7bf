"""What every CLI command shares: its one error type, the event loop, tables and JSON for
output, and the reading of dates, ages, states and retry changes from options."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Coroutine, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from api.schemas import REQUEST_FIELDS, RetryJob, unknown_field
from projections.domain.lifecycle import JobState
from projections.event_log import utcnow
from projections.models import Job
from projections.rows import JobRow
from projections.writes import RetryChanges

T = TypeVar("T")


class CliError(Exception):
    """Printed as one line on stderr; the command exits 1."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- output ------------------------------------------------------------------------------


def console() -> Console:
    # A terminal keeps its own width (or COLUMNS, if set); piped, wide, so little is cut.
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(width=None if wide else 200, highlight=False)


# Columns of ids: an id is copied from here into the next command, so it is printed whole on
# one line at any width; the other columns give way (wrap, then "…") first.
ID_COLUMNS = frozenset({"job", "key_id", "id"})


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Group:
    """A titled table: the title on a line of its own (not wrapped to the table's width),
    ids whole, a dict or list as JSON (what `--options` takes back)."""
    cells = [[_cell(value) for value in row] for row in rows]
    out = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, column in enumerate(columns):
        if column in ID_COLUMNS:
            longest = max((len(row[i]) for row in cells), default=0)
            out.add_column(column, no_wrap=True, min_width=max(len(column), longest))
        else:
            out.add_column(column, overflow="ellipsis")
    for row in cells:
        out.add_row(*row)
    return Group(Text(title, style="bold", overflow="ellipsis", no_wrap=True), out)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def emit_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def short(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else ""


JOB_COLUMNS = ("job", "org", "state", "prio", "attempt", "error", "created", "started", "finished")


def counted(n: int, noun: str) -> str:
    """`1 job`, `2 jobs`: `noun` is the singular; English plurals of our nouns take an s."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def job_cells(job: Job, spared: int = 0) -> list[Any]:
    """A job's row of a table; `spared`: its calls that a 429 refused, which spent no
    attempt (the row's `attempt` counts every call)."""
    attempts = f"{job.attempt - spared}/{job.max_attempts}"
    return [
        job.job_id,
        job.org,
        job.state.value,
        job.priority,
        attempts + (f" +{spared} 429" if spared else ""),
        job.error_kind,
        short(job.created_at),
        short(job.started_at),
        short(job.finished_at),
    ]


def operator_row(job: Job) -> dict[str, Any]:
    """The client's job row (whole: long options too) plus what only an operator sees."""
    row = JobRow.model_validate(job).model_dump(mode="json", exclude={"options_omitted"})
    return {**row, "org": job.org, "author": job.author, "worker": job.worker}


# -- input -------------------------------------------------------------------------------

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_when(value: str, option: str) -> datetime:
    """An ISO-8601 date or time (UTC unless it says otherwise), or an age such as 7d or 12h."""
    ago = _AGO.match(value.strip())
    if ago:
        return utcnow() - timedelta(**{_UNIT[ago.group(2)]: float(ago.group(1))})
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as err:
        raise CliError(
            f"{option} wants an ISO-8601 date/time (2025-01-31, 2025-01-31T12:00Z) or an age "
            f"(30m, 12h, 7d), not {value!r}"
        ) from err
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def parse_state(value: str | None) -> JobState | None:
    if value is None:
        return None
    try:
        return JobState(value)
    except ValueError as err:
        raise CliError(
            f"--state must be one of {', '.join(s.value for s in JobState)}, not {value!r}"
        ) from err


def parse_retry_changes(
    options: str | None, priority: int | None, max_attempts: int | None
) -> RetryChanges:
    """A retry's replacements from the command line, validated as the API validates them."""
    body: dict[str, Any] = {"priority": priority, "max_attempts": max_attempts}
    if options is not None:
        try:
            body["options"] = json.loads(options)
        except json.JSONDecodeError as err:
            raise CliError(f"--options is not JSON: {err}") from err
    try:
        return RetryJob.model_validate(body).changes()
    except ValidationError as err:
        # In the API's words (a misspelt field is answered with the one it likely meant).
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: "
            + (
                unknown_field(str(e["loc"][-1]), REQUEST_FIELDS)
                if e["type"] == "extra_forbidden"
                else e["msg"]
            )
            for e in err.errors()
        )
        raise CliError(f"invalid retry: {problems}") from err
