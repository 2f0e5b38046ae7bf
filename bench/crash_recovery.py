"""Crash recovery: SIGKILL the worker mid-call; time until the job runs on another worker."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

from sqlalchemy import select
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.testing import WorkflowEnvironment

from bench.harness import Report, dev_temporal, scratch, service, target, wait_for_pollers
from projections.models import Job
from promptjobs.runtime import Projection

HEARTBEATS_S = [10.0, 2.0]
TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
LATENCY_MS = 3000
TIMEOUT_S = 120


async def row(projection: Projection, job_id: str) -> Job:
    async with projection.sessions() as session:
        job = (await session.execute(select(Job).where(Job.job_id == job_id))).scalar_one()
        return job


async def until(projection: Projection, job_id: str, state: str, attempt: int) -> float:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        job = await row(projection, job_id)
        if job.state.value == state and job.attempt >= attempt:
            return time.monotonic()
        await asyncio.sleep(0.02)
    raise TimeoutError(f"job {job_id} not {state} (attempt {attempt}) within {TIMEOUT_S} s")


async def sticky_timeouts(env: WorkflowEnvironment, job_id: str) -> int:
    """Workflow tasks that waited on the dead worker's sticky queue until they timed out."""
    history = await env.client.get_workflow_handle(job_id).fetch_history()
    return sum(
        1
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
        and event.workflow_task_timed_out_event_attributes.timeout_type
        == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START
    )


async def main() -> Report:
    report = Report(
        "crash recovery",
        {
            "heartbeat timeouts": f"{HEARTBEATS_S} s (PROMPTJOBS_HEARTBEAT_TIMEOUT_S)",
            "trials": f"{TRIALS} per timeout",
            "adapter": f"fake, latency_ms={LATENCY_MS}",
            "method": "two `promptjobs worker` processes polling; SIGKILL the one the row "
            "names as running the job, as soon as it shows running; clock from the kill to "
            "the row showing attempt 2 running, and to succeeded",
        },
    )
    report.start()
    with scratch() as data_dir:
        async with dev_temporal(data_dir) as env:
            for heartbeat in HEARTBEATS_S:
                for trial in range(TRIALS):
                    sub = data_dir / f"hb{heartbeat}-{trial}"
                    sub.mkdir()
                    async with service(target(env), sub, heartbeat_timeout_s=heartbeat) as (
                        svc,
                        projection,
                        http,
                    ):
                        workers = {w.pid: w for w in (svc.spawn("worker"), svc.spawn("worker"))}
                        await wait_for_pollers(env, svc.settings.temporal_task_queue, count=2)
                        accepted = await http.post(
                            "/v1/prompts",
                            json={
                                "prompt": "crash",
                                "options": {"fake": {"latency_ms": LATENCY_MS}},
                            },
                        )
                        job_id = accepted.json()["job_id"]
                        await until(projection, job_id, "running", 1)
                        # Kill the worker the row names (host:pid) mid-call; the other is up.
                        holder = (await row(projection, job_id)).worker or ""
                        workers[int(holder.rsplit(":", 1)[1])].send_signal(signal.SIGKILL)
                        killed = time.monotonic()
                        running = await until(projection, job_id, "running", 2)
                        succeeded = await until(projection, job_id, "succeeded", 2)
                        stalls = await sticky_timeouts(env, job_id)
                        report.add(
                            f"heartbeat {heartbeat:.0f} s, trial {trial + 1}: kill → running",
                            f"{running - killed:.1f} s",
                            "< 30 s (seed: 5 min)",
                        )
                        report.add(
                            f"heartbeat {heartbeat:.0f} s, trial {trial + 1}: kill → succeeded",
                            f"{succeeded - killed:.1f} s "
                            f"(attempt {(await row(projection, job_id)).attempt}; "
                            f"{stalls} workflow task(s) timed out on the dead worker's "
                            "sticky queue)",
                        )
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
