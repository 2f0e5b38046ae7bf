"""What a provider's batch API gives a provider batch of deferrable jobs (issue 33): send
the lines, find a batch sent before (so a repeated send adopts it instead of sending twice),
read its status, cancel it, and read its results line by line. An adapter that has one
answers `batches()` with it; the fake has none."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from activities.adapters.base import Adapter, AdapterRequest
from activities.errors import AdapterError
from projections.domain.lifecycle import AttemptResult

# The metadata key (OpenAI) a provider batch carries our batch id under.
BATCH_TAG = "promptjobs_batch"


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


class BatchAPI(Protocol):
    async def find(self, tag: str) -> str | None:
        """The id of a batch sent before under our batch id `tag`, if the provider has one."""
        ...

    async def submit(self, tag: str, model: str, lines: list[AdapterRequest]) -> str:
        """Send one batch (each line's custom_id its job id); its provider id. Raise
        BatchUnsupported if the provider has no batch API, AdapterError on a failure."""
        ...

    async def status(self, provider_batch_id: str) -> BatchStatus: ...

    async def cancel(self, provider_batch_id: str) -> None: ...

    def results(self, provider_batch_id: str) -> AsyncIterator[LineResult]:
        """Every line the provider reports on, in its order (any order)."""
        ...


def batch_api_of(adapter: Adapter) -> BatchAPI | None:
    """The adapter's batch API, or None where its provider has none (the fake)."""
    batches = getattr(adapter, "batches", None)
    return None if batches is None else batches()
