"""Where a job's attempt starts, as a worker decides it in the start's transaction (the
projector's `Places`): the worker's view of the fleet's provider circuits (projections/
circuits.py, read at most every `refresh_s`) sends an attempt past a place whose circuit is
open, and a job kept waiting by its place's budget longer than its `fallback_after_s` to its
next place; and what each call's end tells the circuit of its place."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from activities.adapters.base import AdapterRegistry
from activities.adapters.options import PromptOptions, targets
from activities.stale import AtMostEvery
from projections import metrics
from projections.budgets import budget_name
from projections.circuits import Circuits, claim_probe
from projections.domain.lifecycle import OUTAGE_KINDS
from projections.errors import database_unavailable
from projections.group_commit import WriteTx
from projections.models import Job, Prompt, job_options
from projections.projector import Moved


@dataclass
class WorkerCircuits:
    store: Circuits
    adapters: AdapterRegistry
    # Outage failures in a row, fleet-wide, that open a place's circuit, and for how long
    # (PROMPTJOBS_CIRCUIT_FAILURES, PROMPTJOBS_CIRCUIT_COOLDOWN_S).
    threshold: int = 5
    cooldown_s: float = 30.0
    refresh_s: float = 1.0
    # How long a probe's claim holds before another attempt may try the place instead: a
    # probe whose worker died (or whose start went no further) gives way after this.
    probe_s: float = 30.0
    # How long a job waits for room in its place's budget before it moves on, unless it
    # says (options.fallback_after_s; PROMPTJOBS_FALLBACK_AFTER_S).
    fallback_after_s: float = 30.0
    # Places that opened and have not answered since, until when they are open (past it: a
    # probe at a time); places with failures counted (a success there closes them).
    _tripped: dict[str, datetime] = field(default_factory=dict)
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
        self._failing = {s.place for s in standings}
        self._tripped = {
            s.place: until
            for s in standings
            if (until := s.open_until or s.opened_at) is not None and s.tripped
        }

    @property
    def choosing(self) -> bool:
        """Whether any place's circuit opened and has not closed since: then an attempt's
        start chooses its place (`at_start`)."""
        return bool(self._tripped)

    def _places(self, job: Job, prompt: Prompt) -> tuple[PromptOptions, list[str]] | None:
        """The job's options and its places' names, if it has more than one place."""
        try:
            options = PromptOptions.model_validate(job_options(job, prompt))
        except ValueError:
            return None  # options this version cannot run: the attempt says so
        places = [
            budget_name(self.adapters.provider_of(o), self.adapters.model_of(o))
            for o in targets(options)
        ]
        return (options, places) if len(places) > 1 else None

    def at_start(self, tx: WriteTx, job: Job, prompt: Prompt) -> Moved | None:
        """Where the job's attempt starts, if not at its place now (in the start's
        transaction): its own place if that is closed, or past its cool-down and this
        attempt is its probe; else the next of its places that is so. None: where it is
        (it has no other place, or none would take it)."""
        known = self._places(job, prompt)
        if known is None:
            return None
        _, places = known
        at = job.fallback % len(places)
        index = self._first_taking(tx, places, at, len(places))
        if index is None or index == at:
            return None
        why = f"circuit open at {places[at]}: started at the job's place {index} instead"
        return Moved(index, why)

    def when_busy(
        self, tx: WriteTx, job: Job, prompt: Prompt, waited_s: float
    ) -> Moved | float | None:
        """The job's budget at its place has no room: past its `fallback_after_s` of waiting,
        the next of its places that would take it; before, how long until then."""
        known = self._places(job, prompt)
        if known is None:
            return None
        options, places = known
        after = options.fallback_after_s
        if after is None:
            after = self.fallback_after_s
        if waited_s < after:
            return after - waited_s
        at = job.fallback % len(places)
        index = self._first_taking(tx, places, at + 1, len(places) - 1)
        if index is None:
            return None
        why = (
            f"waited {waited_s:.0f} s for room in {places[at]}'s budget: started at the job's "
            f"place {index} instead"
        )
        return Moved(index, why, again_s=max(after, 1.0))

    def _first_taking(self, tx: WriteTx, places: list[str], first: int, count: int) -> int | None:
        """The first of the `count` places from `first` on (going round) that would take an
        attempt now: closed, or past its cool-down with this attempt as its probe."""
        now = datetime.now(UTC)
        for step in range(count):
            index = (first + step) % len(places)
            if self._takes(tx, places[index], now):
                return index
        return None

    def _takes(self, tx: WriteTx, place: str, now: datetime) -> bool:
        until = self._tripped.get(place)
        if until is None:
            return True  # closed
        if until > now:
            return False  # open
        return claim_probe(tx, place, now, self.probe_s)

    async def after_call(self, place: str, outcome: str) -> None:
        """What a call's end at `place` tells its circuit: an outage counts a failure (and
        may open it), a success closes it; anything else says nothing of the place."""
        if outcome in OUTAGE_KINDS:
            standing = await self.store.failed(
                place, threshold=self.threshold, cooldown_s=self.cooldown_s
            )
            self._failing.add(place)
            if standing.open_until is not None and standing.is_open(datetime.now(UTC)):
                known = self._tripped.get(place)
                if known is None or known < standing.open_until:
                    metrics.CIRCUIT_OPENED.labels(place=place[:100]).inc()
                self._tripped[place] = standing.open_until
        elif outcome == "succeeded" and (place in self._failing or place in self._tripped):
            await self.store.succeeded(place)
            self._failing.discard(place)
            self._tripped.pop(place, None)
        elif place in self._tripped:
            await self.store.probed(place)
