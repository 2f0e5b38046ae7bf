"""A worker's view of the fleet's provider circuits (projections/circuits.py): which places are
open now (read at most every `refresh_s`), where a job's attempt starts when its place is
open, and what each call's end tells the circuit of its place."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from activities.adapters.base import AdapterRegistry
from activities.adapters.options import PromptOptions, targets
from activities.stale import AtMostEvery
from projections import metrics
from projections.budgets import budget_name
from projections.circuits import Circuits
from projections.domain.lifecycle import OUTAGE_KINDS
from projections.errors import database_unavailable
from projections.models import Job, Prompt, job_options


@dataclass
class WorkerCircuits:
    store: Circuits
    adapters: AdapterRegistry
    # Outage failures in a row, fleet-wide, that open a place's circuit, and for how long
    # (PROMPTJOBS_CIRCUIT_FAILURES, PROMPTJOBS_CIRCUIT_COOLDOWN_S).
    threshold: int = 5
    cooldown_s: float = 30.0
    refresh_s: float = 1.0
    # Open places, until when; places with failures counted (a success there closes them).
    _open: dict[str, datetime] = field(default_factory=dict)
    _failing: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._every = AtMostEvery(self.refresh_s, self._read)

    async def refresh(self) -> None:
        await self._every()

    async def _read(self) -> None:
        try:
            standings = await self.store.standings()
        except Exception as err:  # the last read stands
            if not database_unavailable(err):
                raise
            return
        now = datetime.now(UTC)
        self._failing = {s.place for s in standings}
        self._open = {s.place: s.open_until for s in standings if s.open_until and s.is_open(now)}

    def any_open(self) -> bool:
        now = datetime.now(UTC)
        return any(until > now for until in self._open.values())

    def is_open(self, place: str) -> bool:
        until = self._open.get(place)
        return until is not None and until > datetime.now(UTC)

    def place_of(self, job: Job, prompt: Prompt) -> int | None:
        """Where the job's attempt starts, if not at its place now: the next of its places
        whose circuit is closed, when its own is open. None: where it is (its place is
        closed, it has no other, or every other is open too)."""
        try:
            options = PromptOptions.model_validate(job_options(job, prompt))
        except ValueError:
            return None  # options this version cannot run: the attempt says so
        places = [
            budget_name(self.adapters.provider_of(o), self.adapters.model_of(o))
            for o in targets(options)
        ]
        if len(places) < 2:
            return None
        at = job.fallback % len(places)
        if not self.is_open(places[at]):
            return None
        for step in range(1, len(places)):
            index = (at + step) % len(places)
            if not self.is_open(places[index]):
                return index
        return None

    async def after_call(self, place: str, outcome: str) -> None:
        """What a call's end at `place` tells its circuit: an outage counts a failure (and
        may open it), a success closes it; anything else says nothing of the place."""
        if outcome in OUTAGE_KINDS:
            standing = await self.store.failed(
                place, threshold=self.threshold, cooldown_s=self.cooldown_s
            )
            self._failing.add(place)
            if standing.open_until is not None and standing.is_open(datetime.now(UTC)):
                if place not in self._open or self._open[place] < standing.open_until:
                    metrics.CIRCUIT_OPENED.labels(place=place[:100]).inc()
                self._open[place] = standing.open_until
        elif outcome == "succeeded" and (place in self._failing or place in self._open):
            await self.store.succeeded(place)
            self._failing.discard(place)
            self._open.pop(place, None)
