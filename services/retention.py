"""The retention schedule: `jobs archive` run by Temporal, visible in the Web UI's Schedules page.

Every worker makes sure, when it starts, that the schedule says what its settings say (it
creates the schedule, or updates it when the period or the interval changed; with retention
off it deletes it). The schedule is per task queue, so deployments sharing a namespace keep
their own. Runs never overlap (a run still going when the next is due makes that one skip).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from activities.contracts import ArchiveExpired
from services.gone import GONE, unless_gone
from workflows.retention import RetentionWorkflow

log = logging.getLogger("promptjobs.retention")


def schedule_id(task_queue: str) -> str:
    return f"promptjobs-retention-{task_queue}"


@dataclass(frozen=True)
class RetentionPolicy:
    """What the settings say of retention (PROMPTJOBS_RETENTION_*), for one task queue."""

    task_queue: str
    days: float  # 0: off
    batch: int
    interval_s: float


def retention_schedule(policy: RetentionPolicy) -> Schedule:
    days = policy.days
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RetentionWorkflow.run,
            ArchiveExpired(retention_days=days, batch=policy.batch),
            id=schedule_id(policy.task_queue),
            task_queue=policy.task_queue,
            execution_timeout=timedelta(hours=2),
        ),
        spec=ScheduleSpec(
            intervals=[ScheduleIntervalSpec(every=timedelta(seconds=policy.interval_s))]
        ),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(
            note=f"Removes settled jobs finished more than {days:g} days ago "
            "(PROMPTJOBS_RETENTION_DAYS), as `promptjobs jobs archive` does."
        ),
    )


async def ensure_retention_schedule(client: Client, policy: RetentionPolicy) -> None:
    """Create, update or (retention off) delete this task queue's schedule."""
    handle = client.get_schedule_handle(schedule_id(policy.task_queue))
    if policy.days <= 0:
        if await unless_gone(handle.delete()) is not GONE:
            log.warning("retention off: deleted schedule %s", handle.id)
        return
    schedule = retention_schedule(policy)
    try:
        await client.create_schedule(handle.id, schedule)
    except ScheduleAlreadyRunningError:

        def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
            # An operator's pause (and its note) outlives worker restarts.
            if current.description.schedule.state.paused:
                schedule.state = current.description.schedule.state
            return ScheduleUpdate(schedule=schedule)

        await handle.update(update)


async def keep_retention_schedule(
    client: Client, policy: RetentionPolicy, stop: asyncio.Event
) -> None:
    """`ensure_retention_schedule` once, retried while Temporal is unreachable, then wait for
    `stop` (a part of the worker process that lives as long as it). A schedule that cannot be
    set never stops the worker from running jobs."""
    delay = 1.0
    while not stop.is_set():
        try:
            await ensure_retention_schedule(client, policy)
            await stop.wait()
            return
        except Exception as err:
            log.warning("could not set the retention schedule (%s); retrying", err)
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            delay = min(delay * 2, 60)
