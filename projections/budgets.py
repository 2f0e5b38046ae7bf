"""Provider budgets: the requests and tokens a minute that every worker together may send to
one provider's model, scheduled rather than failed.

A budget is a row of `provider_budgets` named `provider/model`; its limits are the operator's
(`promptjobs budgets set`) or, where the operator set none, those the provider's rate-limit
headers taught (`learned_*`). What it has spent is its **draws** of the last minute: each
attempt that calls the provider draws one request and its tokens, reserved as an estimate in
the transaction that starts the attempt and reconciled to what the provider reported when the
call ends. The window is the same sliding minute providers count over, so a budget never lets
through a request the provider would refuse for its limit.

An attempt that does not fit waits, queued, holding no worker slot: its job gets a row in
`budget_waiters` with a **rank** (lower goes first), and its workflow sleeps until the
dispatcher wakes it when there is room, or its own timer fires at the time the room is
expected. A job fits only if the room left is more than what the waiters ranked before it
need, so a newcomer never jumps the queue and a big job is not starved by small ones. The rank
is `when the job began to wait + priority * aging_s + its org's recent use` (a call's share
of the window for each call the org drew in the last one), so an org that just had the budget
to itself yields to another's job. A job's effective priority improves by one for every
`aging_s` it waits, so a priority-90 job overtakes fresh priority-10 work of its org after
80 * aging_s (docs/decisions.md).

A 429 pauses the budget until the provider's Retry-After for every worker (`paused_until`),
and gives back the refused call's draw: the provider did not count it.

On PostgreSQL the check and the draw are serialised per budget by an advisory lock held for
the transaction (and per org, first, where the org has a token quota over all its budgets);
on SQLite the single writer serialises them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, Select, delete, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections import spend
from projections.domain import budgets as rules
from projections.domain.budgets import Limits
from projections.domain.errors import Refused
from projections.domain.lifecycle import JobState
from projections.group_commit import GroupCommit, WriteTx, dialect_insert
from projections.models import Base, BudgetDraw, BudgetWaiter, Job, OrgLimit, ProviderBudget

JOBS = Base.metadata.tables[Job.__tablename__]
BUDGETS = Base.metadata.tables[ProviderBudget.__tablename__]
DRAWS = Base.metadata.tables[BudgetDraw.__tablename__]
WAITERS = Base.metadata.tables[BudgetWaiter.__tablename__]
LIMITS = Base.metadata.tables[OrgLimit.__tablename__]
Cap = spend.Cap

# The window providers count their per-minute limits over, unless the deployment says
# another (PROMPTJOBS_BUDGET_WINDOW_S: the Projector's `budget_window`).
WINDOW = timedelta(seconds=60)


# pg_advisory_xact_lock(key1, key2): this namespace, then the budget's hash.
BUDGET_LOCK_NAMESPACE = 7215003
# The same, for an org's token quota over all its budgets (keyed by the org's hash).
ORG_QUOTA_LOCK_NAMESPACE = 7215004
_BUDGET_LOCK = text("SELECT pg_advisory_xact_lock(:namespace, hashtext(:budget))")
# A waiting job's timer fires no sooner than this, and no later than WINDOW: the room it
# waits for is at most a window away, or the dispatcher's wake comes first.
LEAST_WAIT = timedelta(milliseconds=50)


def budget_name(provider: str, model: str) -> str:
    return f"{provider}/{model}"[:200]


# How long the first call on a provider and model may take to say its limits before another
# call probes instead (its worker died, say).
PROBE_FOR = timedelta(seconds=30)


@dataclass(frozen=True)
class Draw:
    """What an attempt asks of a budget before its call: one request and `tokens`. `probe`:
    its provider says its limits in its answers, so a call on a provider and model with no
    budget yet goes alone first, to learn them."""

    budget: str
    tokens: int
    priority: int
    aging_s: float
    probe: bool = False
    # The job's org: its waiting jobs take turns with other orgs' (`_rank`).
    org: str = ""
    # The org's own quota of tokens a minute over every budget (`orgs limit --tpm`), if any.
    org_tpm: int | None = None
    # The spend caps the call counts against (its org's, its key's: projections/spend.py),
    # what it may cost, and the key that submitted its job.
    caps: tuple[Cap, ...] = ()
    usd: float | None = 0.0
    key_id: str | None = None


@dataclass(frozen=True)
class BudgetWait:
    """An attempt that does not fit its budget now: why, and when the room is expected."""

    budget: str
    until: datetime
    reason: str
    # A spend cap's wait (projections/spend.py): the same wherever the job runs, so it never
    # moves a job on to another of its places.
    spend: bool = False

    def describe(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Probe:
    """The call is to probe its budget's limits (the first on its provider and model, or
    the one after a probe that never answered): `draw`, what it draws meanwhile (its org's
    quota, if any). The probe is claimed (`claim_probe`) only once the call surely starts,
    in the same transaction: a job its org's slots refuse takes no probe."""

    draw: Draw | None


class OverBudget(Refused, ValueError):
    """A job whose call alone needs more tokens than its provider budget has in a minute:
    it could never run, so it is refused at submission."""

    code = "over_provider_budget"

    def __init__(self, budget: str, tokens: int, tpm: int) -> None:
        super().__init__(
            f"this job needs at least {tokens} tokens (its prompt and system text, about four "
            f"characters a token, and its max_tokens), more than provider budget {budget} "
            f"allows in a minute ({tpm}): shorten the prompt or lower max_tokens"
        )
        self.budget = budget
        self.tokens = tokens
        self.tpm = tpm


# -- inside the transaction that starts an attempt ---------------------------------------


def check(
    tx: WriteTx, job_id: str, draw: Draw, now: datetime, window: timedelta
) -> Draw | BudgetWait | Probe | None:
    """Whether the attempt may call now (`BudgetCheck.run`)."""
    return BudgetCheck(tx, job_id, now, window).run(draw)


def take(
    tx: WriteTx, job_id: str, attempt: int, draw: Draw, now: datetime, window: timedelta
) -> None:
    """The started attempt's draw: one request and its estimated tokens, from now (and the
    budget's draws that no longer count go)."""
    since = now - rules.held_for(window)
    tx.execute(delete(DRAWS).where(DRAWS.c.budget == draw.budget, DRAWS.c.drawn_at <= since))
    tx.execute(
        DRAWS.insert().values(
            budget=draw.budget, job_id=job_id, attempt=attempt, drawn_at=now, tokens=draw.tokens
        )
    )
    stop_waiting(tx, job_id)
    if draw.caps:
        spend.hold(tx, job_id, attempt, draw.org, draw.key_id, draw.usd or 0.0, now)


def claim_probe(tx: WriteTx, budget: str, now: datetime) -> None:
    """The call that starts now probes `budget`: the others wait for its answer (PROBE_FOR
    at most). The budget is made if it is new."""
    _ensure(tx, budget, now)
    tx.execute(update(BUDGETS).where(BUDGETS.c.name == budget).values(probe_until=now + PROBE_FOR))


def waiter_of(tx: WriteTx, job_id: str) -> Row[Any] | None:
    """The job's place among its budget's waiters (and since when it waits), if it waits."""
    waiter: Row[Any] | None = tx.execute(select(WAITERS).where(WAITERS.c.job_id == job_id)).first()
    return waiter


def wait_again(tx: WriteTx, waiter: Row[Any]) -> None:
    """Put the job back in its place among a budget's waiters (as `waiter_of` read it)."""
    tx.execute(WAITERS.insert().values(**waiter._mapping))


def ask_again_by(tx: WriteTx, job_id: str, wait: BudgetWait, by: datetime) -> BudgetWait:
    """The wait, asked again by `by` at the latest (the job may move on to another of its
    places then): on its row too."""
    if wait.until <= by:
        return wait
    tx.execute(
        update(JOBS)
        .where(JOBS.c.job_id == job_id, JOBS.c.state == JobState.QUEUED)
        .values(next_attempt_at=by)
    )
    return replace(wait, until=by)


def stop_waiting(tx: WriteTx, job_id: str) -> None:
    """The job no longer waits for a budget or a cap (it runs, or waits for something else)."""
    tx.execute(delete(WAITERS).where(WAITERS.c.job_id == job_id))
    spend.stop_waiting(tx, job_id)


def spent(budget: str, since: datetime) -> Select[Any]:
    """The requests and tokens `budget` has drawn since `since` (the window's)."""
    return select(func.count(), func.coalesce(func.sum(DRAWS.c.tokens), 0)).where(
        DRAWS.c.budget == budget, DRAWS.c.drawn_at > since
    )


class BudgetCheck:
    """One attempt's check against its provider budget (and its org's token quota), inside
    the transaction that would start it: the SQL reads, and the arithmetic of
    projections/domain/budgets.py over them, with the providers' `window`."""

    def __init__(self, tx: WriteTx, job_id: str, now: datetime, window: timedelta) -> None:
        self.tx = tx
        self.job_id = job_id
        self.now = now
        self.window = window
        # Draws after this still count (the window and its margin).
        self.since = now - rules.held_for(window)

    def run(self, draw: Draw) -> Draw | BudgetWait | Probe | None:
        """The draw to `take` once the attempt has started in the same transaction (its
        tokens at most the budget's minute: a job that fits at all must fit some time), or
        None when the budget has no limits to draw on; else the wait, recorded: the job's
        place among the budget's waiters, and on its row why it waits and until about when.

        The first call on a provider and model that says its limits is a probe: it goes
        alone, and the others wait for its answer (PROBE_FOR at most), so a cold backlog
        does not hit the provider all at once before anyone knows its limits."""
        tx, now = self.tx, self.now
        free: Draw | None = None
        if draw.caps:
            # Checked first, each under its lock (taken before any budget's): the room a cap
            # leaves is the same whichever budget the call draws on.
            capped = spend.check(tx, self.job_id, draw.caps, draw.usd, draw.budget, now)
            if capped is not None:
                return BudgetWait(draw.budget, capped.until, capped.reason, spend=True)
            free = draw
        if tx.postgresql:
            if draw.org_tpm is not None:
                # The org's quota spans all its budgets: its attempts on two models must not
                # both pass it. Taken before the budget's lock, always in that order.
                lock = {"namespace": ORG_QUOTA_LOCK_NAMESPACE, "budget": draw.org}
                tx.execute(_BUDGET_LOCK, lock)
            tx.execute(_BUDGET_LOCK, {"namespace": BUDGET_LOCK_NAMESPACE, "budget": draw.budget})
        # Where the org has a quota every call draws, so the org's minute counts them all.
        if (quota := draw.org_tpm) is not None:
            draw = replace(draw, tokens=min(draw.tokens, quota))
            if (over := self._over_org_quota(draw, quota)) is not None:
                return over
            free = draw
        budget = tx.execute(select(BUDGETS).where(BUDGETS.c.name == draw.budget)).first()
        if budget is None:
            return Probe(free) if draw.probe else free
        limits = Limits.of(budget)
        paused = budget.paused_until is not None and budget.paused_until > now
        if limits.rpm is None and limits.tpm is None and not paused:
            if budget.probe_until is None:
                return free
            if budget.probe_until <= now:
                # The probe never answered: this call probes instead.
                return Probe(free)
            reason = (
                f"provider budget {draw.budget}: waiting for the provider's first answer, "
                "which says its rate limits"
            )
            held = self._held_rank(draw)
            new_rank = self._rank(draw, limits) if held is None else None
            # The dispatcher wakes it, in rank order, once the probe's answer is in; by itself
            # it asks again only when the probe would time out (waiters do not poll meanwhile).
            return self._wait(draw, new_rank, budget.probe_until, reason)
        if limits.tpm is not None and draw.tokens > limits.tpm:
            draw = replace(draw, tokens=limits.tpm)
        held = self._held_rank(draw)
        rank = held if held is not None else self._rank(draw, limits)
        ahead_n, ahead_tokens = self._ahead(draw.budget, rank)
        requests, tokens = (int(n) for n in tx.execute(spent(draw.budget, self.since)).one())
        if not paused and rules.fits(limits, requests, tokens, ahead_n, ahead_tokens, draw.tokens):
            return draw
        if paused:
            until = budget.paused_until
            reason = (
                f"provider budget {draw.budget} is paused by the provider's rate limit (HTTP "
                f"429) until {until:%H:%M:%S} UTC"
            )
        else:
            until = self._room_at(draw, limits, requests + ahead_n, tokens + ahead_tokens)
            used = []
            if limits.rpm is not None:
                used.append(f"{requests} of {limits.rpm} requests")
            if limits.tpm is not None:
                used.append(f"{tokens} of {limits.tpm} tokens")
            reason = (
                f"provider budget {draw.budget}: {' and '.join(used)} in the last minute"
                + (f", {ahead_n} job(s) ahead of this one" if ahead_n else "")
                + f"; room expected about {until:%H:%M:%S} UTC"
            )
        return self._wait(draw, rank if held is None else None, until, reason)

    def _wait(self, draw: Draw, new_rank: float | None, until: datetime, reason: str) -> BudgetWait:
        """Record the wait: a new waiter's place (`new_rank`), and why on the job's row."""
        now = self.now
        until = min(max(until, now + LEAST_WAIT), now + rules.held_for(self.window))
        if new_rank is not None:
            self.tx.execute(
                WAITERS.insert().values(
                    job_id=self.job_id,
                    budget=draw.budget,
                    rank=new_rank,
                    tokens=draw.tokens,
                    since=now,
                )
            )
        self.tx.execute(
            update(JOBS)
            .where(JOBS.c.job_id == self.job_id, JOBS.c.state == JobState.QUEUED)
            .values(waiting_for=reason[:1000], next_attempt_at=until)
        )
        return BudgetWait(draw.budget, until, reason)

    def _held_rank(self, draw: Draw) -> float | None:
        """The job's rank among the budget's waiters, if it waits already."""
        held = self.tx.execute(
            select(WAITERS.c.rank).where(
                WAITERS.c.job_id == self.job_id, WAITERS.c.budget == draw.budget
            )
        ).scalar()
        return None if held is None else float(held)

    def _over_org_quota(self, draw: Draw, quota: int) -> BudgetWait | None:
        """The wait, if the org's draws of the last window on every budget leave no room for
        this one within its quota (the job's timer asks again when room is expected)."""
        rows = self.tx.execute(
            select(DRAWS.c.drawn_at, DRAWS.c.tokens)
            .select_from(DRAWS.join(JOBS, JOBS.c.job_id == DRAWS.c.job_id))
            .where(JOBS.c.org == draw.org, DRAWS.c.drawn_at > self.since)
            .order_by(DRAWS.c.drawn_at)
        ).all()
        draws = [(drawn_at, int(tokens)) for drawn_at, tokens in rows]
        until = rules.quota_room_at(draws, quota, draw.tokens, self.now, self.window)
        if until is None:
            return None
        used = sum(tokens for _, tokens in draws)
        reason = (
            f"org {draw.org}'s token quota: {used} of its {quota} tokens a minute drawn in the "
            f"last minute; room expected about {until:%H:%M:%S} UTC"
        )
        return self._wait(draw, None, until, reason)

    def _rank(self, draw: Draw, limits: Limits) -> float:
        """A new waiter's rank (projections/domain/budgets.rank), its org's calls on the
        budget in the last window read here."""
        used = self.tx.execute(
            select(func.count())
            .select_from(DRAWS.join(JOBS, JOBS.c.job_id == DRAWS.c.job_id))
            .where(
                DRAWS.c.budget == draw.budget,
                DRAWS.c.drawn_at > self.since,
                JOBS.c.org == draw.org,
            )
        ).scalar_one()
        return rules.rank(
            self.now, draw.priority, draw.aging_s, limits, draw.tokens, int(used), self.window
        )

    def _ahead(self, budget: str, rank: float) -> tuple[int, int]:
        """The waiters ranked before `rank` whose jobs still wait, and the tokens they need."""
        ahead = (
            select(func.count(), func.coalesce(func.sum(WAITERS.c.tokens), 0))
            .select_from(WAITERS.join(JOBS, JOBS.c.job_id == WAITERS.c.job_id))
            .where(
                WAITERS.c.budget == budget,
                WAITERS.c.rank < rank,
                WAITERS.c.job_id != self.job_id,
                JOBS.c.state == JobState.QUEUED,
            )
        )
        count, tokens = self.tx.execute(ahead).one()
        return int(count), int(tokens)

    def _room_at(self, draw: Draw, limits: Limits, requests: int, tokens: int) -> datetime:
        """When this draw will fit (projections/domain/budgets.budget_room_at), counting what
        the waiters before it need; the window's draws read here."""
        rows = self.tx.execute(
            select(DRAWS.c.drawn_at, DRAWS.c.tokens)
            .where(DRAWS.c.budget == draw.budget, DRAWS.c.drawn_at > self.since)
            .order_by(DRAWS.c.drawn_at)
        ).all()
        draws = [(drawn_at, int(used)) for drawn_at, used in rows]
        return rules.budget_room_at(
            draws, limits, requests, tokens, draw.tokens, self.now, self.window
        )


# -- after the call --------------------------------------------------------------------


def reconcile(tx: WriteTx, job_id: str, attempt: int, tokens: int) -> None:
    """Charge the attempt's draw what the provider reported, giving back the rest."""
    tx.execute(
        update(DRAWS)
        .where(DRAWS.c.job_id == job_id, DRAWS.c.attempt == attempt)
        .values(tokens=tokens, reconciled=True)
    )


def rate_limited(
    tx: WriteTx, budget: str, job_id: str, attempt: int, until: datetime, now: datetime
) -> None:
    """The provider answered 429: pause the budget until `until` for every worker (the
    later pause wins), count it, and give back this call's draw (not counted by the
    provider). A budget nobody set or taught yet is made, paused, with no limits."""
    _ensure(tx, budget, now)
    tx.execute(
        update(BUDGETS)
        .where(BUDGETS.c.name == budget)
        .values(
            paused_until=func.coalesce(
                func.max(BUDGETS.c.paused_until, until)
                if not tx.postgresql
                else func.greatest(BUDGETS.c.paused_until, until),
                until,
            ),
            rate_limited=BUDGETS.c.rate_limited + 1,
            updated_at=now,
        )
    )
    tx.execute(delete(DRAWS).where(DRAWS.c.job_id == job_id, DRAWS.c.attempt == attempt))


def learn(tx: WriteTx, budget: str, rpm: int | None, tpm: int | None, now: datetime) -> None:
    """The provider's own limits, from its headers (None: it did not say); a probe is over."""
    _ensure(tx, budget, now)
    values: dict[str, Any] = {"updated_at": now, "probe_until": None}
    if rpm is not None:
        values["learned_rpm"] = rpm
    if tpm is not None:
        values["learned_tpm"] = tpm
    tx.execute(update(BUDGETS).where(BUDGETS.c.name == budget).values(values))


def drawn_after(
    tx: WriteTx, budget: str, job_id: str, attempt: int, drawn_at: datetime, tokens: int
) -> None:
    tx.execute(
        DRAWS.insert().values(
            budget=budget,
            job_id=job_id,
            attempt=attempt,
            drawn_at=drawn_at,
            tokens=tokens,
            reconciled=True,
        )
    )


def _ensure(tx: WriteTx, budget: str, now: datetime) -> None:
    tx.execute(
        dialect_insert(BUDGETS, postgresql=tx.postgresql)
        .values(name=budget, updated_at=now, rate_limited=0)
        .on_conflict_do_nothing()
    )


# -- the repository: what the worker, the dispatcher and the CLI ask ------------------


@dataclass(frozen=True)
class BudgetStanding:
    """What `promptjobs budgets list` and /metrics show of one budget."""

    name: str
    rpm: int | None
    tpm: int | None
    own_rpm: int | None
    own_tpm: int | None
    learned_rpm: int | None
    learned_tpm: int | None
    requests: int  # drawn in the last minute
    tokens: int  # of those, reconciled: what the provider reported
    reserved: int  # of those, not yet reconciled: estimates of calls in flight
    waiting: int
    paused_until: datetime | None
    rate_limited: int


class Budgets:
    """The provider budgets as stored (`JobStore.budgets`)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        writes: GroupCommit,
        window: timedelta = WINDOW,
    ) -> None:
        self.sessions = sessions
        self.writes = writes
        # The window the providers' limits count over (PROMPTJOBS_BUDGET_WINDOW_S).
        self.window = window

    async def known(self) -> dict[str, bool]:
        """Every budget, and whether it may refuse a call now (a limit, a pause, a probe)."""
        binding = or_(
            BUDGETS.c.rpm.is_not(None),
            BUDGETS.c.tpm.is_not(None),
            BUDGETS.c.learned_rpm.is_not(None),
            BUDGETS.c.learned_tpm.is_not(None),
            BUDGETS.c.paused_until > datetime.now(UTC),
            BUDGETS.c.probe_until.is_not(None),
        )
        async with self.sessions() as session:
            rows = await session.execute(select(BUDGETS.c.name, binding))
            return {name: bool(binds) for name, binds in rows}

    async def org_quotas(self) -> dict[str, int]:
        """Each org's own tokens a minute over every budget, where it has a quota."""
        async with self.sessions() as session:
            rows = await session.execute(
                select(LIMITS.c.org, LIMITS.c.tpm).where(LIMITS.c.tpm.is_not(None))
            )
            return {org: int(tpm) for org, tpm in rows}

    async def token_limits(self) -> dict[str, int]:
        """Each budget's tokens a minute in force, where it has a limit."""
        async with self.sessions() as session:
            rows = await session.execute(select(BUDGETS))
            return {row.name: tpm for row in rows if (tpm := Limits.of(row).tpm) is not None}

    async def set_limits(self, name: str, rpm: int | None, tpm: int | None, now: datetime) -> None:
        """The operator's limits for `name` (None: leave it to what the provider teaches)."""

        def write(tx: WriteTx) -> None:
            _ensure(tx, name, now)
            tx.execute(
                update(BUDGETS)
                .where(BUDGETS.c.name == name)
                .values(rpm=rpm, tpm=tpm, updated_at=now)
            )

        await self.writes.run(write)

    async def forget(self, name: str) -> bool:
        """Remove a budget: its limits, learned and set, and its pause."""

        def write(tx: WriteTx) -> bool:
            gone = tx.execute(delete(BUDGETS).where(BUDGETS.c.name == name))
            return bool(gone.rowcount)

        return await self.writes.run(write)

    async def learn(self, name: str, rpm: int | None, tpm: int | None, now: datetime) -> None:
        await self.writes.run(lambda tx: learn(tx, name, rpm, tpm, now))

    async def discard_unanswered(self, name: str, *, probing: bool = False) -> None:
        """Remove a budget its probe made, if nothing more was set or learned on it since;
        a budget that stays is no longer probed by this call (`probing`)."""

        def write(tx: WriteTx) -> None:
            tx.execute(
                delete(BUDGETS).where(
                    BUDGETS.c.name == name,
                    BUDGETS.c.rpm.is_(None),
                    BUDGETS.c.tpm.is_(None),
                    BUDGETS.c.learned_rpm.is_(None),
                    BUDGETS.c.learned_tpm.is_(None),
                    BUDGETS.c.paused_until.is_(None),
                )
            )
            if probing:
                tx.execute(update(BUDGETS).where(BUDGETS.c.name == name).values(probe_until=None))

        await self.writes.run(write)

    async def drawn_after(
        self, name: str, job_id: str, attempt: int, drawn_at: datetime, tokens: int
    ) -> None:
        """A call made without a draw (it started before its budget was known): count it,
        as the provider does, from when it was made."""
        await self.writes.run(lambda tx: drawn_after(tx, name, job_id, attempt, drawn_at, tokens))

    async def reconcile(self, job_id: str, attempt: int, tokens: int) -> None:
        await self.writes.run(lambda tx: reconcile(tx, job_id, attempt, tokens))

    async def rate_limited(
        self, name: str, job_id: str, attempt: int, until: datetime, now: datetime
    ) -> None:
        await self.writes.run(lambda tx: rate_limited(tx, name, job_id, attempt, until, now))

    async def standing(self, now: datetime) -> list[BudgetStanding]:
        async with self.sessions() as session:
            budgets = (await session.execute(select(BUDGETS).order_by(BUDGETS.c.name))).all()
            drawn = {
                name: (int(n), int(done or 0), int(pending or 0))
                for name, n, done, pending in await session.execute(
                    select(
                        DRAWS.c.budget,
                        func.count(),
                        func.sum(DRAWS.c.tokens).filter(DRAWS.c.reconciled.is_(True)),
                        func.sum(DRAWS.c.tokens).filter(DRAWS.c.reconciled.is_(False)),
                    )
                    .where(DRAWS.c.drawn_at > now - rules.held_for(self.window))
                    .group_by(DRAWS.c.budget)
                )
            }
            waiting: dict[str, int] = dict(
                (
                    await session.execute(
                        select(WAITERS.c.budget, func.count())
                        .select_from(WAITERS.join(JOBS, JOBS.c.job_id == WAITERS.c.job_id))
                        .where(JOBS.c.state == JobState.QUEUED)
                        .group_by(WAITERS.c.budget)
                    )
                ).all()
            )
        standings = []
        for row in budgets:
            limits = Limits.of(row)
            requests, tokens, reserved = drawn.get(row.name, (0, 0, 0))
            standings.append(
                BudgetStanding(
                    name=row.name,
                    rpm=limits.rpm,
                    tpm=limits.tpm,
                    own_rpm=row.rpm,
                    own_tpm=row.tpm,
                    learned_rpm=row.learned_rpm,
                    learned_tpm=row.learned_tpm,
                    requests=requests,
                    tokens=tokens,
                    reserved=reserved,
                    waiting=int(waiting.get(row.name, 0)),
                    paused_until=row.paused_until
                    if row.paused_until and row.paused_until > now
                    else None,
                    rate_limited=row.rate_limited,
                )
            )
        return standings

    async def to_wake(self, now: datetime, batch: int = 1000) -> list[str]:
        """The waiting jobs to wake now: of each budget with room, as many of its first-ranked
        waiters as the room takes. Waiters whose jobs no longer wait are dropped first."""
        woken: list[str] = []
        async with self.sessions() as session:
            names = list((await session.execute(select(WAITERS.c.budget).distinct())).scalars())
        if not names:
            return woken

        def tidy(tx: WriteTx) -> None:
            settled = select(JOBS.c.job_id).where(
                JOBS.c.job_id == WAITERS.c.job_id, JOBS.c.state != JobState.QUEUED
            )
            tx.execute(delete(WAITERS).where(settled.exists()))

        await self.writes.run(tidy)
        async with self.sessions() as session:
            for name in names:
                row = (await session.execute(select(BUDGETS).where(BUDGETS.c.name == name))).first()
                if row is not None and row.paused_until is not None and row.paused_until > now:
                    continue
                limits = Limits.of(row) if row is not None else Limits(None, None)
                if row is not None and row.probe_until is not None and row.probe_until > now:
                    continue  # the probe's answer is not in yet
                since = now - rules.held_for(self.window)
                requests, tokens = (await session.execute(spent(name, since))).one()
                room_requests = batch if limits.rpm is None else limits.rpm - int(requests)
                room_tokens = math.inf if limits.tpm is None else limits.tpm - int(tokens)
                first = await session.execute(
                    select(WAITERS.c.job_id, WAITERS.c.tokens)
                    .where(WAITERS.c.budget == name)
                    .order_by(WAITERS.c.rank, WAITERS.c.job_id)
                    .limit(max(0, min(room_requests, batch)))
                )
                for job_id, needs in first:
                    if needs > room_tokens:
                        break
                    room_tokens -= needs
                    woken.append(job_id)
        return woken
