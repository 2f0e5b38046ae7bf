"""Provider circuits in the projection, on SQLite and PostgreSQL: outage failures counted
fleet-wide open a place's circuit at the threshold, a failure past the cool-down opens it
again at once, a success closes it."""

from __future__ import annotations

import asyncio

from projections.circuits import claim_probe
from projections.event_log import utcnow
from promptjobs.wiring import Projection

# Circuits are counted by every worker at once: each test runs on PostgreSQL too.
BOTH_DATABASES = True

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


async def test_past_the_cool_down_one_attempt_at_a_time_may_probe(
    projection: Projection,
) -> None:
    circuits = projection.store.circuits

    async def claim(probe_s: float = 30.0) -> bool:
        claimed: bool = await circuits.writes.run(
            lambda tx: claim_probe(tx, PLACE, utcnow(), probe_s)
        )
        return claimed

    for _ in range(2):
        await circuits.failed(PLACE, threshold=2, cooldown_s=0.2)
    assert not await claim()  # open: nobody tries it
    await asyncio.sleep(0.3)
    assert await claim()  # the probe
    assert not await claim()  # the others keep going elsewhere meanwhile

    # The probe failed: open again for a cool-down, then the next probe.
    reopened = await circuits.failed(PLACE, threshold=2, cooldown_s=0.2)
    assert reopened.is_open(utcnow()) and reopened.probe_until is None
    await asyncio.sleep(0.3)
    assert await claim(probe_s=0.1)
    await asyncio.sleep(0.2)  # that probe's worker died: another may try
    assert await claim()
