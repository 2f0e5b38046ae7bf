"""What a provider's batch API gives a provider batch of deferrable jobs (issue 33): send
the lines, find a batch sent before (so a repeated send adopts it instead of sending twice),
read its status, cancel it, and read its results line by line. An adapter that has one
answers `batches()` with it; the fake has none."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError

from activities.adapters.base import Adapter, AdapterRequest
from activities.errors import AdapterError
from projections.domain.lifecycle import AttemptResult, ErrorKind

# The metadata key (OpenAI) a provider batch carries our batch id under.
BATCH_TAG = "promptjobs_batch"
# How far a provider's clock (and its whole-second times) may lag ours when a batch is
# looked for among those made since a send began.
CLOCK_SLACK = timedelta(seconds=5)


class BatchUnsupported(Exception):
    """The provider has no batch API (a compatible server that answers 404 to /v1/batches)."""


@dataclass(frozen=True)
class BatchStatus:
    """A provider batch as its provider tells it: `status` in the provider's own words;
    `running`: it works on the lines; `ended`: it will run no more of them."""

    status: str
    running: bool
    ended: bool


@dataclass(frozen=True)
class LineResult:
    """One line's end: a result, an error (classified as a direct call's would be), or
    neither: the provider did not run it (the batch expired or was cancelled first)."""

    custom_id: str
    result: AttemptResult | None = None
    error: AdapterError | None = None


@dataclass(frozen=True)
class UnreadableLine:
    """A result line that is not JSON and names no job we can find in it: counted on the
    batch, it settles no job (each of the others still settles from its own line)."""

    excerpt: str


ResultLine = LineResult | UnreadableLine
# A custom_id as it stands in a line too broken to parse (cut short, say).
_CUSTOM_ID = re.compile(r'"custom_id"\s*:\s*"([^"\\]{1,255})"')


def read_result_line(
    provider: str, line: str, read: Callable[[str, dict[str, Any]], LineResult]
) -> ResultLine:
    """One line of a provider's results (JSONL, `custom_id` and the provider's own fields,
    which `read` reads). A line that cannot be read costs its own job alone: its job fails as
    `parse`, as a direct call's unreadable answer does (the provider ran it and billed it:
    it is never sent again); a line that names no job is an UnreadableLine."""
    row: Any = None
    try:
        row = json.loads(line)
    except ValueError:
        pass
    custom_id = row.get("custom_id") if isinstance(row, dict) else None
    if not isinstance(custom_id, str):
        found = _CUSTOM_ID.search(line)
        if found is None:
            return UnreadableLine(line[:200])
        custom_id = found.group(1)
        row = None
    unreadable = AdapterError(
        ErrorKind.PARSE, f"{provider}: unreadable batch result line: {line[:200]!r}"
    )
    if row is None:
        return LineResult(custom_id, error=unreadable)
    try:
        return read(custom_id, row)
    except AdapterError as err:
        return LineResult(custom_id, error=err)
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError):
        return LineResult(custom_id, error=unreadable)


class BatchAPI(Protocol):
    async def find(self, tag: str, since: datetime, lines: int) -> list[str]:
        """The batches a send of ours under our batch id `tag`, begun at `since` with `lines`
        lines, may have made, oldest first: the one tagged so, where the provider keeps a
        tag (OpenAI's metadata); else those made since then with as many lines (Anthropic)."""
        ...

    async def submit(self, tag: str, model: str, lines: AsyncIterable[AdapterRequest]) -> str:
        """Send one batch (each line's custom_id its job id); its provider id. Raise
        BatchUnsupported if the provider has no batch API, AdapterError on a failure."""
        ...

    async def status(self, provider_batch_id: str) -> BatchStatus: ...

    async def cancel(self, provider_batch_id: str) -> None: ...

    def results(self, provider_batch_id: str) -> AsyncIterator[ResultLine]:
        """Every line the provider reports on, in its order (any order); a line it cannot
        read is yielded as what it is (`read_result_line`), never raised."""
        ...


def batch_api_of(adapter: Adapter) -> BatchAPI | None:
    """The adapter's batch API, or None where its provider has none (the fake)."""
    batches = getattr(adapter, "batches", None)
    return None if batches is None else batches()
