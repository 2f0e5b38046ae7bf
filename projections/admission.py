"""Each org's share of the fleet: at most N of its jobs running at once, across all workers.

A job is *admitted* (takes one of its org's slots) in the transaction that starts its first
attempt, and holds the slot until it settles, waits between attempts included. The count is of
admitted, unsettled rows, so a slot frees in the very commit that settles a job, whichever
process writes it. A job refused stays `queued`: its workflow sleeps, holding no worker slot,
until the dispatcher signals that its org has room (or a re-check timer fires), then tries
again (workflows/prompt_job.py).

The limit is the org's row in `org_limits`, else PROMPTJOBS_ORG_MAX_RUNNING; 0 is no limit.
On PostgreSQL the count and the admission are serialised per org by an advisory lock held
for the transaction (other orgs' admissions and every other write go on concurrently); on
SQLite the single writer serialises them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    bindparam,
    delete,
    func,
    or_,
    select,
    text,
    union,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.lifecycle import UNSETTLED, JobState
from projections.group_commit import GroupCommit, WriteTx
from projections.models import ApiKey, Base, Job, OrgLimit
from projections.prepared import Prepared

JOBS = Base.metadata.tables[Job.__tablename__]
LIMITS = Base.metadata.tables[OrgLimit.__tablename__]
KEYS = Base.metadata.tables[ApiKey.__tablename__]
# pg_advisory_xact_lock(key1, key2): this namespace, then the org's hash.
ORG_LOCK_NAMESPACE = 7215002


@dataclass(frozen=True)
class Waiting:
    """A job refused a slot: its org runs `running` jobs of its `limit`."""

    org: str
    running: int
    limit: int

    def describe(self) -> str:
        return (
            f"org {self.org} has {self.running} of its {self.limit} jobs running at once; "
            "this job waits queued for a slot"
        )


def _limit_of(org: Any, default: Any) -> ColumnElement[int]:
    own = select(LIMITS.c.max_running).where(LIMITS.c.org == org).scalar_subquery()
    return func.coalesce(own, default)


def _running_in(org: Any) -> ColumnElement[int]:
    others = JOBS.alias("admitted")
    return (
        select(func.count())
        .select_from(others)
        .where(
            others.c.org == org,
            others.c.admitted_at.is_not(None),
            others.c.state.in_(UNSETTLED),
        )
        .scalar_subquery()
    )


def _admit_statement() -> Any:
    # Binds given a value (None) at build time are not required at compile time; each run
    # gives them theirs.
    limit = _limit_of(JOBS.c.org, bindparam("default_limit", None, type_=Integer()))
    return (
        update(JOBS)
        .where(
            JOBS.c.job_id == bindparam("job_id", None, type_=JOBS.c.job_id.type),
            JOBS.c.admitted_at.is_(None),
            JOBS.c.state == JobState.QUEUED,
            or_(limit == 0, _running_in(JOBS.c.org) < limit),
        )
        .values(
            admitted_at=bindparam("now", None, type_=JOBS.c.admitted_at.type),
            awaiting_slot_since=None,
        )
        .returning(JOBS.c.job_id)
    )


_admit: dict[str, Prepared] = {}  # the admission, compiled once per dialect

_ORG_LOCK = text(
    "SELECT pg_advisory_xact_lock(:namespace, hashtext(org)) FROM jobs WHERE job_id = :job_id"
)


def admit(tx: WriteTx, job_id: str, default_limit: int, now: datetime) -> Waiting | None:
    """Give `job_id` a slot of its org if it has none and the org has room. None: it holds
    one now (or already did), or it is no longer queued (the attempt's transition decides
    what that means). Otherwise the row records that it waits, and why."""
    params = {"job_id": job_id, "default_limit": default_limit, "now": now}
    if tx.postgresql:
        tx.execute(_ORG_LOCK, {"namespace": ORG_LOCK_NAMESPACE, "job_id": job_id})
    statement = _admit.get(tx.conn.dialect.name)
    if statement is None:
        statement = _admit[tx.conn.dialect.name] = Prepared(_admit_statement(), tx.conn.dialect)
    if statement.run(tx, params) is not None:
        return None
    seen = tx.execute(
        select(
            JOBS.c.org,
            JOBS.c.state,
            JOBS.c.admitted_at,
            _running_in(JOBS.c.org),
            _limit_of(JOBS.c.org, default_limit),
        ).where(JOBS.c.job_id == job_id)
    ).first()
    if seen is None or seen.admitted_at is not None or seen.state is not JobState.QUEUED:
        return None
    org, _, _, running, limit = seen
    tx.execute(
        update(JOBS)
        .where(JOBS.c.job_id == job_id, JOBS.c.awaiting_slot_since.is_(None))
        .values(awaiting_slot_since=now)
    )
    return Waiting(org, int(running), int(limit))


def fleet_share(configured: int, live_slots: int, active_orgs: int) -> int:
    """An org's default running limit (where it has none of its own): the configured one
    (PROMPTJOBS_ORG_MAX_RUNNING, 0: none), but never more than its fair part of the live
    fleet's slots. With other orgs at work each gets an equal part; alone, an org may take
    all but a tenth of the fleet (at least one slot), so the next org's job finds a slot at
    once instead of waiting for one of the first org's to end. Without a known fleet (no
    worker has registered), the configured limit."""
    if live_slots <= 0:
        return configured
    headroom = max(1, live_slots // 10) if live_slots > 1 else 0
    fair = max(1, min(live_slots - headroom, -(-live_slots // max(1, active_orgs))))
    return fair if configured == 0 else min(configured, fair)


@dataclass(frozen=True)
class OrgShare:
    """What `promptjobs orgs list` shows of one org."""

    org: str
    limit: int
    own_limit: bool
    running: int
    waiting: int
    # Its own quota of tokens a minute over every provider budget, if any.
    tpm: int | None = None


def _waiting() -> list[ColumnElement[bool]]:
    return [
        JOBS.c.awaiting_slot_since.is_not(None),
        JOBS.c.admitted_at.is_(None),
        JOBS.c.state == JobState.QUEUED,
    ]


async def _shares(
    session: AsyncSession, orgs: list[str], default_limit: int
) -> dict[str, OrgShare]:
    own = dict(
        (
            await session.execute(
                select(LIMITS.c.org, LIMITS.c.max_running).where(
                    LIMITS.c.org.in_(orgs), LIMITS.c.max_running.is_not(None)
                )
            )
        ).all()
    )
    counts = (
        select(
            JOBS.c.org,
            func.count().filter(JOBS.c.admitted_at.is_not(None)),
            func.count().filter(
                JOBS.c.admitted_at.is_(None), JOBS.c.awaiting_slot_since.is_not(None)
            ),
        )
        .where(JOBS.c.org.in_(orgs), JOBS.c.state.in_(UNSETTLED))
        .group_by(JOBS.c.org)
    )
    found = {org: (int(r), int(w)) for org, r, w in (await session.execute(counts)).all()}
    quotas = dict(
        (
            await session.execute(
                select(LIMITS.c.org, LIMITS.c.tpm).where(
                    LIMITS.c.org.in_(orgs), LIMITS.c.tpm.is_not(None)
                )
            )
        ).all()
    )
    return {
        org: OrgShare(
            org,
            own.get(org, default_limit),
            org in own,
            *found.get(org, (0, 0)),
            quotas.get(org),
        )
        for org in orgs
    }


class OrgShares:
    """Each org's share of the fleet as stored (`JobStore.orgs`): its limit, what runs, and
    who waits."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def slot_waiters(self, default_limit: int, batch: int = 1000) -> list[str]:
        """The waiting jobs to wake now: of each org with waiters, as many as it has free slots
        (at most `batch`), most urgent first (priority, then the longest waiting). Chosen per
        org, so one org's thousands of waiters, and no free slot, cannot crowd out another's."""
        async with self.sessions() as session:
            orgs = list(
                (await session.execute(select(JOBS.c.org).where(*_waiting()).distinct())).scalars()
            )
            if not orgs:
                return []
            shares = await _shares(session, orgs, default_limit)
            wake: list[str] = []
            for org in orgs:
                share = shares[org]
                free = batch if share.limit == 0 else min(batch, share.limit - share.running)
                if free <= 0:
                    continue
                most_urgent = (
                    select(JOBS.c.job_id)
                    .where(JOBS.c.org == org, *_waiting())
                    .order_by(JOBS.c.priority, JOBS.c.awaiting_slot_since, JOBS.c.job_id)
                    .limit(free)
                )
                wake.extend((await session.execute(most_urgent)).scalars())
        return wake

    async def active(self) -> int:
        """Orgs with jobs running (holding a slot) or waiting for one."""
        async with self.sessions() as session:
            orgs = select(func.count(func.distinct(JOBS.c.org))).where(
                JOBS.c.state.in_(UNSETTLED),
                or_(JOBS.c.admitted_at.is_not(None), JOBS.c.awaiting_slot_since.is_not(None)),
            )
            return int((await session.execute(orgs)).scalar_one())

    async def shares(self, default_limit: int) -> list[OrgShare]:
        """Every org the store knows, by name: with API keys, jobs (settled ones too) or a limit
        of its own."""
        async with self.sessions() as session:
            known = union(
                select(JOBS.c.org), select(LIMITS.c.org), select(KEYS.c.org)
            )  # UNION: each org once, however many rows name it
            orgs = set((await session.execute(known)).scalars())
            shares = await _shares(session, sorted(orgs), default_limit)
        return [shares[org] for org in sorted(orgs)]

    async def set_limit(self, org: str, max_running: int | None) -> None:
        """Give `org` a running limit of its own (0: none), or with None the default again."""
        await self._set(org, max_running=max_running)

    async def set_token_quota(self, org: str, tpm: int | None) -> None:
        """Give `org` a quota of tokens a minute on provider budgets, or with None none."""
        await self._set(org, tpm=tpm)

    async def _set(self, org: str, **values: int | None) -> None:
        await self.writes.run(lambda tx: set_org_limits(tx, org, values))


# Every column of an org's limits row but its name and time.
_LIMIT_COLUMNS = ("max_running", "tpm", "usd_per_day", "over_cap")


def set_org_limits(tx: WriteTx, org: str, values: Mapping[str, Any]) -> None:
    """Change some of `org`'s own limits, keeping the rest; a row with none left goes. The
    read and the write in one write transaction: another writer cannot come between them."""
    row = tx.execute(select(LIMITS).where(LIMITS.c.org == org)).first()
    kept: dict[str, Any] = {
        column: None if row is None else getattr(row, column) for column in _LIMIT_COLUMNS
    }
    kept.update(values)
    tx.execute(delete(LIMITS).where(LIMITS.c.org == org))
    if any(kept[column] is not None for column in ("max_running", "tpm", "usd_per_day")):
        tx.execute(LIMITS.insert().values({"org": org, **kept, "updated_at": datetime.now(UTC)}))
