"""Spend caps: the most an org, or one of its API keys, may spend in a UTC day, in US dollars,
enforced before the money is spent.

A call under a cap **holds** what it may cost (`spend_holds`: the price table times the tokens
its budget draw estimates) in the transaction that starts it, after checking that what the
cap's day has spent (the `attempts` that ended since midnight UTC) and holds (the calls in
flight) leave room for it. The attempt's record, with what it did cost, takes the hold's place
in the transaction that writes it (projections/streams.record_attempt), so money is never
counted twice nor dropped between the two. A call whose worker died keeps its hold for the
day: what it cost is unknown, not nothing.

An attempt that does not fit waits queued, holding no worker slot: its job gets a row in
`spend_waiters` and its `waiting_for` names the cap and when it resets. The dispatcher wakes the
longest waiting as the room allows (`SpendCaps.to_wake`: the cap raised or removed, calls that
cost less than they held), and the day's turn wakes the rest by their own timers.

On PostgreSQL the check and the hold are serialised per cap by an advisory lock held for the
transaction (the org's first, then the key's, before any budget's: always in that order), so
workers together pass a cap by at most what their calls' estimates fell short; on SQLite the
single writer serialises them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import Select, bindparam, delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.admission import set_org_limits
from projections.domain.errors import Refused
from projections.domain.lifecycle import JobState
from projections.group_commit import GroupCommit, WriteTx
from projections.models import ApiKey, AttemptRecord, Base, Job, OrgLimit, SpendHold, SpendWaiter

JOBS = Base.metadata.tables[Job.__tablename__]
ATTEMPTS = Base.metadata.tables[AttemptRecord.__tablename__]
HOLDS = Base.metadata.tables[SpendHold.__tablename__]
WAITERS = Base.metadata.tables[SpendWaiter.__tablename__]
LIMITS = Base.metadata.tables[OrgLimit.__tablename__]
KEYS = Base.metadata.tables[ApiKey.__tablename__]

# pg_advisory_xact_lock(key1, key2): this namespace, then the cap's hash (projections/
# budgets.py has 7215003 and 7215004).
SPEND_LOCK_NAMESPACE = 7215005
_LOCK = text("SELECT pg_advisory_xact_lock(:namespace, hashtext(:cap))")
# What a submission past its org's cap meets, where the org chose to be refused.
REFUSE = "refuse"
# The shares of a cap at which a log line and a metric say so (docs/operators.md).
THRESHOLDS = (0.8, 1.0)
# Dollars are summed as floats: a call that fits to the billionth fits.
EPSILON = 1e-9
# How often a job under a cap whose model has no price asks again.
UNPRICED_RECHECK = timedelta(minutes=5)


def day_of(now: datetime) -> datetime:
    """The start of `now`'s UTC day: a cap's day."""
    return datetime.combine(now.astimezone(UTC).date(), time(), UTC)


def resets_at(now: datetime) -> datetime:
    return day_of(now) + timedelta(days=1)


@dataclass(frozen=True)
class Cap:
    """One cap a call counts against: its org's (`key_id` None) or its key's."""

    org: str
    usd_per_day: float
    key_id: str | None = None

    @property
    def name(self) -> str:
        """`org:NAME` or `key:ID`: how waiters and locks name it."""
        return f"org:{self.org}" if self.key_id is None else f"key:{self.key_id}"

    def describe(self) -> str:
        return f"org {self.org}'s" if self.key_id is None else f"API key {self.key_id}'s"


def spent_query(cap: Cap, since: datetime) -> Select[Any]:
    """What `cap` has spent since `since` (its attempts' costs) and holds (its calls in
    flight), in US dollars. A key's attempts are its jobs' (`jobs.key_id`)."""
    settled = select(func.coalesce(func.sum(ATTEMPTS.c.cost_usd), 0.0)).where(
        ATTEMPTS.c.org == cap.org, ATTEMPTS.c.ended_at >= since
    )
    held = select(func.coalesce(func.sum(HOLDS.c.usd), 0.0)).where(HOLDS.c.held_at >= since)
    if cap.key_id is None:
        held = held.where(HOLDS.c.org == cap.org)
    else:
        settled = settled.select_from(
            ATTEMPTS.join(JOBS, JOBS.c.job_id == ATTEMPTS.c.job_id)
        ).where(JOBS.c.key_id == cap.key_id)
        held = held.where(HOLDS.c.key_id == cap.key_id)
    return select(settled.scalar_subquery(), held.scalar_subquery())


class OverSpendCap(Refused, ValueError):
    """A submission past a cap whose org chose to be refused rather than queued (429, and
    OpenAI's `insufficient_quota` on its routes)."""

    code = "insufficient_quota"

    def __init__(self, cap: Cap, spent: float, resets: datetime) -> None:
        super().__init__(
            f"{cap.describe()} spend cap of ${cap.usd_per_day:.2f} a day is reached (${spent:.4f}"
            f" spent or held today); it resets {resets:%Y-%m-%d %H:%M} UTC: submit then, or ask "
            "an operator to raise it"
        )
        self.cap = cap
        self.resets = resets


class CostsMoreThanCap(Refused, ValueError):
    """A job whose call alone may cost more than a cap allows in a day: it could never run
    under it (422)."""

    code = "over_spend_cap"

    def __init__(self, cap: Cap, usd: float) -> None:
        super().__init__(
            f"this job may cost up to ${usd:.4f} (its prompt and max_tokens at its model's "
            f"price), more than {cap.describe()} spend cap of ${cap.usd_per_day:.2f} a day: "
            "lower max_tokens, shorten the prompt, or ask an operator to raise the cap"
        )
        self.cap = cap
        self.usd = usd


class UnpricedUnderCap(Refused, ValueError):
    """A job under a spend cap on a model the price table does not price: what it would cost
    is unknown, so it could slip past the cap (PROMPTJOBS_CAPS_ALLOW_UNPRICED lets such calls
    through, counted as free)."""

    code = "unpriced_model"

    def __init__(self, cap: Cap, model: str) -> None:
        super().__init__(
            f"model {model} has no price in the price table, and {cap.describe()} spend cap "
            "needs one to hold what a call may cost: choose a priced model, or ask an operator "
            "to price it (PROMPTJOBS_PRICES_FILE)"
        )
        self.cap = cap
        self.model = model


# -- inside the transaction that starts an attempt ---------------------------------------


@dataclass(frozen=True)
class OverCap:
    """An attempt that does not fit a cap now: why, and when to ask again (its day's end)."""

    until: datetime
    reason: str


def check(
    tx: WriteTx,
    job_id: str,
    caps: tuple[Cap, ...],
    usd: float | None,
    place: str,
    now: datetime,
    *,
    wait: bool = True,
) -> OverCap | None:
    """Whether a call that may cost `usd` fits every cap it counts against; the first it does
    not fit is recorded as the job's wait (a waiter's row, `waiting_for`). `usd` None: its
    model (at `place`) has no price, so no cap can hold it: it waits for one (a price file
    read at the workers' restart, or PROMPTJOBS_CAPS_ALLOW_UNPRICED), asking again from time
    to time rather than being woken. `wait` False: nothing is recorded of a call that does
    not fit (a batch's line, which then runs directly)."""
    if tx.postgresql:
        for cap in caps:  # the org's, then the key's: always in that order
            tx.execute(_LOCK, {"namespace": SPEND_LOCK_NAMESPACE, "cap": cap.name})
    if usd is None:
        reason = (
            f"{place} has no price in the workers' price table, and {caps[0].describe()} spend "
            "cap needs one to hold what a call may cost: an operator adds it "
            "(PROMPTJOBS_PRICES_FILE) or allows unpriced models (PROMPTJOBS_CAPS_ALLOW_UNPRICED)"
        )
        if not wait:
            return OverCap(now, reason)
        return _wait(tx, job_id, None, 0.0, now + UNPRICED_RECHECK, reason, now)
    since = day_of(now)
    for cap in caps:
        settled, held = tx.execute(spent_query(cap, since)).one()
        used = float(settled) + float(held)
        if used + usd <= cap.usd_per_day + EPSILON:
            continue
        until = resets_at(now)
        alone = (
            f"; this call alone may cost ${usd:.4f}, more than the whole cap"
            if usd > cap.usd_per_day
            else ""
        )
        reason = (
            f"{cap.describe()} spend cap: ${used:.4f} of its ${cap.usd_per_day:.2f} a day spent "
            f"or held by calls in flight{alone}; resets {until:%Y-%m-%d %H:%M} UTC, or sooner if "
            "the cap is raised"
        )
        if not wait:
            return OverCap(until, reason)
        return _wait(tx, job_id, cap, usd, until, reason, now)
    return None


def _wait(
    tx: WriteTx,
    job_id: str,
    cap: Cap | None,
    usd: float,
    until: datetime,
    reason: str,
    now: datetime,
) -> OverCap:
    """Record the job's wait: its place among `cap`'s waiters (kept if it has one), and why
    on its row, until when."""
    held_place = tx.execute(select(WAITERS.c.cap).where(WAITERS.c.job_id == job_id)).scalar()
    if held_place is None or cap is None or held_place != cap.name:
        tx.execute(delete(WAITERS).where(WAITERS.c.job_id == job_id))
        if cap is not None:
            tx.execute(WAITERS.insert().values(job_id=job_id, cap=cap.name, usd=usd, since=now))
    tx.execute(
        update(JOBS)
        .where(JOBS.c.job_id == job_id, JOBS.c.state == JobState.QUEUED)
        .values(waiting_for=reason[:1000], next_attempt_at=until)
    )
    return OverCap(until, reason)


def hold(
    tx: WriteTx, job_id: str, attempt: int, org: str, key_id: str | None, usd: float, now: datetime
) -> None:
    """The started call holds what it may cost (its waiter's row, if any, goes)."""
    tx.execute(delete(HOLDS).where(HOLDS.c.job_id == job_id, HOLDS.c.attempt == attempt))
    tx.execute(
        HOLDS.insert().values(
            job_id=job_id, attempt=attempt, org=org, key_id=key_id, usd=usd, held_at=now
        )
    )
    stop_waiting(tx, job_id)


def stop_waiting(tx: WriteTx, job_id: str) -> None:
    tx.execute(delete(WAITERS).where(WAITERS.c.job_id == job_id))


def release_statement() -> Any:
    """The attempt's hold, gone as its record (what it cost) is written."""
    return delete(HOLDS).where(
        HOLDS.c.job_id == bindparam("job_id"), HOLDS.c.attempt == bindparam("attempt")
    )


# -- the repository: what the worker, the API, the dispatcher and the CLI ask --------------


@dataclass(frozen=True)
class CapStanding:
    """What `promptjobs orgs list`, `keys list`, `status` and /metrics show of one cap."""

    cap: Cap
    spent: float  # by attempts that ended today (UTC)
    held: float  # by calls in flight
    waiting: int

    @property
    def name(self) -> str:
        return self.cap.name

    @property
    def usd_per_day(self) -> float:
        return self.cap.usd_per_day

    @property
    def used(self) -> float:
        return self.spent + self.held

    @property
    def share(self) -> float:
        return self.used / self.cap.usd_per_day if self.cap.usd_per_day else 1.0


@dataclass(frozen=True)
class Caps:
    """Every cap in force: each org's and each key's (by key id, with its org)."""

    orgs: dict[str, Cap]
    keys: dict[str, Cap]
    refusing: frozenset[str]  # orgs whose submissions past the cap are refused

    def of(self, org: str, key_id: str | None) -> tuple[Cap, ...]:
        """The caps a job of `org` submitted with `key_id` counts against, the org's first."""
        found = [self.orgs[org]] if org in self.orgs else []
        if key_id is not None and (key := self.keys.get(key_id)) is not None and key.org == org:
            found.append(key)
        return tuple(found)

    def every(self) -> list[Cap]:
        return [*self.orgs.values(), *self.keys.values()]

    def __bool__(self) -> bool:
        return bool(self.orgs or self.keys)


NO_CAPS = Caps({}, {}, frozenset())


class SpendCaps:
    """The spend caps as stored (`JobStore.spend`)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def caps(self) -> Caps:
        async with self.sessions() as session:
            orgs = await session.execute(
                select(LIMITS.c.org, LIMITS.c.usd_per_day, LIMITS.c.over_cap).where(
                    LIMITS.c.usd_per_day.is_not(None)
                )
            )
            org_rows = orgs.all()
            keys = await session.execute(
                select(KEYS.c.key_id, KEYS.c.org, KEYS.c.usd_per_day).where(
                    KEYS.c.usd_per_day.is_not(None), KEYS.c.revoked_at.is_(None)
                )
            )
            return Caps(
                {org: Cap(org, float(usd)) for org, usd, _ in org_rows},
                {key_id: Cap(org, float(usd), key_id) for key_id, org, usd in keys},
                frozenset(org for org, _, over in org_rows if over == REFUSE),
            )

    async def spent(self, cap: Cap, now: datetime) -> float:
        """What `cap` has spent and holds today."""
        return sum(await self.spent_and_held(cap, now))

    async def spent_and_held(self, cap: Cap, now: datetime) -> tuple[float, float]:
        """What `cap` has spent today, and what its calls in flight hold."""
        async with self.sessions() as session:
            return await _spent_and_held(session, cap, now)

    async def hold_line(
        self,
        job_id: str,
        attempt: int,
        org: str,
        key_id: str | None,
        caps: tuple[Cap, ...],
        usd: float | None,
        place: str,
    ) -> str | None:
        """A provider batch's line holds what it may cost (at the batch price) as the batch
        is sent, by the rules a direct call's start follows; why not, if it does not fit (it
        then runs directly, and waits for the cap there like any job)."""

        def write(tx: WriteTx) -> str | None:
            now = datetime.now(UTC)
            over = check(tx, job_id, caps, usd, place, now, wait=False)
            if over is not None:
                return over.reason
            hold(tx, job_id, attempt, org, key_id, usd or 0.0, now)
            return None

        return await self.writes.run(write)

    async def release(self, job_id: str, attempt: int) -> None:
        """The hold of an attempt that will not be made (a batch's line it did not run)."""
        await self.writes.run(
            lambda tx: tx.execute(
                delete(HOLDS).where(HOLDS.c.job_id == job_id, HOLDS.c.attempt == attempt)
            )
        )

    async def set_org_cap(
        self, org: str, usd_per_day: float | None, over_cap: str | None = None
    ) -> None:
        """Give `org` a cap of `usd_per_day` (None: none); `over_cap` "refuse" or "wait"."""
        values: dict[str, Any] = {"usd_per_day": usd_per_day}
        if over_cap is not None:
            values["over_cap"] = REFUSE if over_cap == REFUSE else None
        await self.writes.run(lambda tx: set_org_limits(tx, org, values))

    async def set_key_cap(self, key_id: str, usd_per_day: float | None) -> bool:
        """Give the key a cap of `usd_per_day` (None: none); False: no such key."""

        def write(tx: WriteTx) -> bool:
            done = tx.execute(
                update(KEYS).where(KEYS.c.key_id == key_id).values(usd_per_day=usd_per_day)
            )
            return bool(done.rowcount)

        return await self.writes.run(write)

    async def standings(self, now: datetime) -> list[CapStanding]:
        caps = await self.caps()
        standings = []
        async with self.sessions() as session:
            waiting: dict[str, int] = dict(
                (
                    await session.execute(
                        select(WAITERS.c.cap, func.count())
                        .select_from(WAITERS.join(JOBS, JOBS.c.job_id == WAITERS.c.job_id))
                        .where(JOBS.c.state == JobState.QUEUED)
                        .group_by(WAITERS.c.cap)
                    )
                ).all()
            )
            for cap in caps.every():
                spent, held = await _spent_and_held(session, cap, now)
                standings.append(CapStanding(cap, spent, held, int(waiting.get(cap.name, 0))))
        return standings

    async def to_wake(self, now: datetime, batch: int = 1000) -> list[str]:
        """The waiting jobs to wake now: of each cap with waiters, the longest waiting, as many
        as its room takes (all of them where the cap is gone). Waiters whose jobs no longer
        wait are dropped first."""
        async with self.sessions() as session:
            names = list((await session.execute(select(WAITERS.c.cap).distinct())).scalars())
        if not names:
            return []

        def tidy(tx: WriteTx) -> None:
            settled = select(JOBS.c.job_id).where(
                JOBS.c.job_id == WAITERS.c.job_id, JOBS.c.state != JobState.QUEUED
            )
            tx.execute(delete(WAITERS).where(settled.exists()))

        await self.writes.run(tidy)
        caps = await self.caps()
        by_name = {cap.name: cap for cap in caps.every()}
        woken: list[str] = []
        async with self.sessions() as session:
            for name in names:
                cap = by_name.get(name)
                room = float("inf")
                if cap is not None:
                    spent, held = await _spent_and_held(session, cap, now)
                    room = cap.usd_per_day - spent - held
                if room <= EPSILON:
                    continue
                first = await session.execute(
                    select(WAITERS.c.job_id, WAITERS.c.usd)
                    .where(WAITERS.c.cap == name)
                    .order_by(WAITERS.c.since, WAITERS.c.job_id)
                    .limit(batch)
                )
                for job_id, needs in first:
                    if needs > room + EPSILON:
                        break
                    room -= needs
                    woken.append(job_id)
        return woken


async def _spent_and_held(session: AsyncSession, cap: Cap, now: datetime) -> tuple[float, float]:
    settled, held = (await session.execute(spent_query(cap, day_of(now)))).one()
    return float(settled), float(held)
