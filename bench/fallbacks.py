"""Provider fallbacks under an outage: jobs that may fall back to a second provider, while the
first goes down for a while in the middle and comes back.

    .venv/bin/python -m bench.fallbacks [quick]

Two `promptjobs mock-provider` processes: the first answers the jobs' place
(`openai/gpt-first`), the second their fallback (`anthropic/claude-second`). 500 jobs are
submitted at 5 a second; 20 s in, the first provider's process is killed (connections refused)
and started again OUTAGE_S later (60 s; `quick`: 20 s). Each answer takes 0.5 s. Figures:
jobs failed (goal 0); each job's time from submission to its end, for the jobs submitted
before, during and after the outage (the outage's added latency); attempts made at the dead
provider, and of them those that started more than 3 s after it went down (the circuit open:
goal at most one per worker per cool-down, PROMPTJOBS_CIRCUIT_COOLDOWN_S = 30 s)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from bench.harness import (
    LOGS,
    Args,
    Report,
    bench_stack,
    free_port,
    mock_provider,
    ms,
    percentile,
    service,
    target,
    wait_for_pollers,
    wait_settled,
)
from projections.models import AttemptRecord, Job

QUICK = "quick" in sys.argv[1:]
JOBS = 500
PER_S = 5.0
DOWN_AT_S = 20.0
OUTAGE_S = 20.0 if QUICK else 60.0
COOLDOWN_S = 30.0
OPTIONS = {
    "provider": "openai",
    "model": "gpt-first",
    "fallbacks": [{"provider": "anthropic", "model": "claude-second"}],
}


def start_first(port: int) -> subprocess.Popen[bytes]:
    """The first provider on `port` (the same each time it starts), answering in 0.5 s."""
    LOGS.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "promptjobs", "mock-provider", "--port", str(port)]
    with (LOGS / "mock-first.log").open("ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


async def main() -> Report:
    report = Report(
        "fallbacks",
        {
            "jobs": f"{JOBS} at {PER_S:g} a second, each answer 0.5 s; place openai/gpt-first, "
            "fallback anthropic/claude-second (two mock-provider processes)",
            "outage": f"the first provider killed {DOWN_AT_S:g} s in, started again "
            f"{OUTAGE_S:g} s later",
            "stack": f"promptjobs api + 1 worker, SQLite; circuit: 5 failures, {COOLDOWN_S:g} s",
        },
    )
    report.start()
    port = free_port()
    first = start_first(port)
    try:
        async with mock_provider() as second:
            env = {
                "PROMPTJOBS_OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                "PROMPTJOBS_OPENAI_API_KEY": "mock",
                "PROMPTJOBS_ANTHROPIC_BASE_URL": second,
                "PROMPTJOBS_ANTHROPIC_API_KEY": "mock",
                "PROMPTJOBS_CIRCUIT_COOLDOWN_S": str(COOLDOWN_S),
                "PROMPTJOBS_MAX_ATTEMPTS_DEFAULT": "4",
            }
            async with (
                bench_stack(Args(0, "sqlite", False)) as (data_dir, temporal, overrides),
                service(target(temporal), data_dir, extra_env=env, **overrides) as (
                    svc,
                    projection,
                    http,
                ),
            ):
                svc.spawn("worker")
                await wait_for_pollers(temporal, svc.settings.temporal_task_queue)
                began = time.monotonic()
                down_at = up_at = None
                for i in range(JOBS):
                    elapsed = time.monotonic() - began
                    if down_at is None and elapsed >= DOWN_AT_S:
                        first.kill()
                        first.wait(10)
                        down_at = datetime.now(UTC)
                    if down_at is not None and up_at is None and elapsed >= DOWN_AT_S + OUTAGE_S:
                        first = start_first(port)
                        up_at = datetime.now(UTC)
                    body = {"prompt": f"fallback {i}", "options": {**OPTIONS}}
                    body["options"]["model"] = "mock:delay_ms=500"
                    (await http.post("/v1/prompts", json=body)).raise_for_status()
                    await asyncio.sleep(max(0.0, began + (i + 1) / PER_S - time.monotonic()))
                _, states = await wait_settled(projection, JOBS, 600)
                async with projection.sessions() as session:
                    jobs = list((await session.execute(select(Job))).scalars())
                    attempts = list((await session.execute(select(AttemptRecord))).scalars())
    finally:
        with contextlib.suppress(ProcessLookupError):
            first.kill()
        first.wait(10)
    assert down_at is not None and up_at is not None
    failed = states.get("failed", 0)
    report.add(
        "final states",
        ", ".join(f"{k} {v}" for k, v in sorted(states.items())),
        "0 failed" if failed == 0 else f"0 failed (got {failed})",
    )
    for name, when in (
        ("before", lambda j: j.created_at < down_at),
        ("during", lambda j: down_at <= j.created_at < up_at),
        ("after", lambda j: j.created_at >= up_at),
    ):
        took = [
            (j.finished_at - j.created_at).total_seconds()
            for j in jobs
            if when(j) and j.finished_at is not None
        ]
        if took:
            report.add(
                f"submission → end, jobs submitted {name} the outage",
                f"p50 {ms(percentile(took, 50))}, p99 {ms(percentile(took, 99))} "
                f"({len(took)} jobs)",
            )
    dead = [
        a
        for a in attempts
        if a.provider == "openai" and a.outcome != "succeeded" and down_at <= a.started_at < up_at
    ]
    late = [a for a in dead if a.started_at > down_at + timedelta(seconds=3)]
    report.add("attempts at the dead provider", f"{len(dead)} ({len(late)} more than 3 s in)")
    report.add(
        "of them after the circuit opened",
        f"{len(late)} over {OUTAGE_S:g} s",
        f"≤ {int(OUTAGE_S // COOLDOWN_S) + 1} (one per cool-down, 1 worker)",
    )
    moved = sum(1 for a in attempts if a.via and a.via.startswith("circuit open"))
    report.add("attempts started elsewhere by the open circuit", str(moved))
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
