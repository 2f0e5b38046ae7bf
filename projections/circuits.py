"""Provider circuits: when a place (a provider's model) fails for everyone, jobs that can run
elsewhere stop going there for a cool-down, fleet-wide.

Every attempt that ends with an outage (`provider_5xx`, `timeout`) at a place counts one
failure there; a success there closes its circuit (failures back to 0). At `threshold`
failures in a row, whichever jobs they came from, the circuit opens for `cooldown_s`: the
workers' attempts of jobs with another place to go start there instead (activities/
circuits.py), spending no attempt on the place that is down. Past the cool-down one attempt
at a time may try it (the probe, claimed in its start's transaction: `claim_probe`) while
the others keep going elsewhere; the probe's failure opens it again for another cool-down,
its success closes it. So a place that stays down gets one call per cool-down from the whole
fleet. Jobs with no other place run where they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.event_log import utcnow
from projections.group_commit import GroupCommit, WriteTx
from projections.models import Base, ProviderCircuit

CIRCUITS = Base.metadata.tables[ProviderCircuit.__tablename__]


@dataclass(frozen=True)
class CircuitStanding:
    """What `promptjobs status` and /metrics show of one place's circuit."""

    place: str
    failures: int
    open_until: datetime | None
    opened_at: datetime | None
    opened: int
    probe_until: datetime | None = None

    def is_open(self, now: datetime) -> bool:
        return self.open_until is not None and self.open_until > now

    @property
    def tripped(self) -> bool:
        """It opened and has not answered since (open, or past its cool-down)."""
        return self.opened_at is not None


def _standing(row: Any) -> CircuitStanding:
    return CircuitStanding(
        row.place, row.failures, row.open_until, row.opened_at, row.opened, row.probe_until
    )


def claim_probe(tx: WriteTx, place: str, now: datetime, probe_s: float) -> bool:
    """Whether this attempt may try `place`, whose circuit is past its cool-down: the one
    probe at a time (a probe whose worker died lets another try after `probe_s`)."""
    claimed = tx.execute(
        update(CIRCUITS)
        .where(
            CIRCUITS.c.place == place,
            or_(CIRCUITS.c.open_until.is_(None), CIRCUITS.c.open_until <= now),
            or_(CIRCUITS.c.probe_until.is_(None), CIRCUITS.c.probe_until <= now),
        )
        .values(probe_until=now + timedelta(seconds=probe_s))
        .returning(CIRCUITS.c.place)
    ).first()
    return claimed is not None


class Circuits:
    """The circuits in the projection (`JobStore.circuits`)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def standings(self) -> list[CircuitStanding]:
        """Every place that has failed lately (failures counted, or open), by name."""
        async with self.sessions() as session:
            rows = await session.execute(
                select(ProviderCircuit)
                .where(ProviderCircuit.failures > 0)
                .order_by(ProviderCircuit.place)
            )
            return [_standing(r) for r in rows.scalars()]

    async def failed(self, place: str, *, threshold: int, cooldown_s: float) -> CircuitStanding:
        """An outage failure at `place`: counted, and the circuit opened for `cooldown_s` if
        that makes `threshold` (or again, past a cool-down). The circuit as it now stands."""

        def write(tx: WriteTx) -> CircuitStanding:
            now = utcnow()
            dialect_insert = pg_insert if tx.postgresql else sqlite_insert
            tx.execute(
                dialect_insert(CIRCUITS)
                .values(place=place, failures=0, opened=0, updated_at=now)
                .on_conflict_do_nothing()
            )
            row = tx.execute(
                update(CIRCUITS)
                .where(CIRCUITS.c.place == place)
                .values(failures=CIRCUITS.c.failures + 1, probe_until=None, updated_at=now)
                .returning(*CIRCUITS.c)
            ).one()
            closed = row.open_until is None or row.open_until <= now
            if row.failures >= threshold and closed:
                row = tx.execute(
                    update(CIRCUITS)
                    .where(CIRCUITS.c.place == place)
                    .values(
                        open_until=now + timedelta(seconds=cooldown_s),
                        opened_at=now,
                        opened=CIRCUITS.c.opened + 1,
                    )
                    .returning(*CIRCUITS.c)
                ).one()
            return _standing(row)

        return await self.writes.run(write)

    async def probed(self, place: str) -> None:
        """A call at `place` ended saying nothing of it (a client error, a cancel): its probe,
        if it was one, is over; the next attempt may try."""

        def write(tx: WriteTx) -> None:
            tx.execute(
                update(CIRCUITS)
                .where(CIRCUITS.c.place == place, CIRCUITS.c.probe_until.is_not(None))
                .values(probe_until=None)
            )

        await self.writes.run(write)

    async def succeeded(self, place: str) -> None:
        """A success at `place`: its circuit closes (nothing is written for a place that
        has not failed)."""

        def write(tx: WriteTx) -> None:
            tx.execute(
                update(CIRCUITS)
                .where(CIRCUITS.c.place == place, CIRCUITS.c.failures > 0)
                .values(
                    failures=0,
                    open_until=None,
                    opened_at=None,
                    probe_until=None,
                    updated_at=utcnow(),
                )
            )

        await self.writes.run(write)
