"""Provider circuits in the projection, on SQLite and PostgreSQL: outage failures counted
fleet-wide open a place's circuit at the threshold, a failure past the cool-down opens it
again at once, a success closes it."""

from __future__ import annotations

import asyncio

from projections.event_log import utcnow
from promptjobs.wiring import Projection

PLACE = "openai/gpt-4o"


async def test_failures_in_a_row_open_the_circuit_and_a_success_closes_it(
    projection: Projection,
) -> None:
    circuits = projection.store.circuits
    first = await circuits.failed(PLACE, threshold=3, cooldown_s=30)
    assert (first.failures, first.is_open(utcnow())) == (1, False)
    await circuits.failed(PLACE, threshold=3, cooldown_s=30)
    opened = await circuits.failed(PLACE, threshold=3, cooldown_s=30)
    assert (opened.failures, opened.opened, opened.is_open(utcnow())) == (3, 1, True)
    # More failures while open neither reopen nor extend it.
    again = await circuits.failed(PLACE, threshold=3, cooldown_s=30)
    assert (again.opened, again.open_until) == (1, opened.open_until)

    await circuits.succeeded(PLACE)
    assert await circuits.standings() == []


async def test_a_failure_past_the_cool_down_opens_it_again_at_once(
    projection: Projection,
) -> None:
    circuits = projection.store.circuits
    for _ in range(2):
        await circuits.failed(PLACE, threshold=2, cooldown_s=0.2)
    await asyncio.sleep(0.3)
    [cooled] = await circuits.standings()
    assert not cooled.is_open(utcnow())

    probe = await circuits.failed(PLACE, threshold=2, cooldown_s=0.2)
    assert (probe.opened, probe.is_open(utcnow())) == (2, True)


async def test_failures_from_many_workers_at_once_are_all_counted(
    projection: Projection,
) -> None:
    circuits = projection.store.circuits
    await asyncio.gather(*(circuits.failed(PLACE, threshold=50, cooldown_s=30) for _ in range(20)))
    [standing] = await circuits.standings()
    assert standing.failures == 20
