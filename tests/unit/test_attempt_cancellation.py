"""An attempt tells apart the three ways its call is cancelled (activities/attempt.py): the
job's row stopping it, the workflow asking, the worker shutting down. Run inside Temporal's
ActivityEnvironment, which cancels an activity as a worker does."""

from __future__ import annotations

import asyncio

import pytest
from temporalio import activity
from temporalio.activity import ActivityCancellationDetails
from temporalio.testing import ActivityEnvironment

from activities.attempt import Cancellation, cancellation


async def cancelled_call(stopped_by_row: bool) -> Cancellation:
    """A call (its own task, as an attempt runs it) awaited by the activity; the row's stop
    cancels the call's task only, Temporal's cancellation the activity."""
    call = asyncio.create_task(asyncio.sleep(60))
    if stopped_by_row:
        asyncio.get_running_loop().call_later(0.05, call.cancel)
    try:
        await call
    except asyncio.CancelledError:
        own = asyncio.current_task()
        return cancellation(
            stopped_by_row,
            own is not None and own.cancelling() > 0,
            activity.cancellation_details(),
        )
    raise AssertionError("the call was not cancelled")


@activity.defn
async def attempt_like(stopped_by_row: bool) -> Cancellation:
    return await cancelled_call(stopped_by_row)


@pytest.mark.parametrize(
    ("details", "stopped_by_row", "expected"),
    [
        (None, True, Cancellation.STOPPED_BY_ROW),
        (ActivityCancellationDetails(cancel_requested=True), False, Cancellation.REQUESTED),
        (ActivityCancellationDetails(worker_shutdown=True), False, Cancellation.WORKER_SHUTDOWN),
        # Asked for, during a shutdown: the workflow's cancel wins.
        (
            ActivityCancellationDetails(cancel_requested=True, worker_shutdown=True),
            False,
            Cancellation.REQUESTED,
        ),
    ],
)
async def test_an_attempt_tells_why_its_call_was_cancelled(
    details: ActivityCancellationDetails | None, stopped_by_row: bool, expected: Cancellation
) -> None:
    env = ActivityEnvironment()
    running = asyncio.create_task(env.run(attempt_like, stopped_by_row))
    if details is not None:
        await asyncio.sleep(0.05)
        env.cancel(cancellation_details=details)
    assert await running is expected


def test_a_stop_by_the_row_while_temporal_also_cancels_is_temporals() -> None:
    """Both at once: the activity itself is being cancelled, so Temporal's word decides."""
    asked = ActivityCancellationDetails(cancel_requested=True)
    assert cancellation(True, True, asked) is Cancellation.REQUESTED
