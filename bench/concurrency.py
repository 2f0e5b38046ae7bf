"""Concurrency: 1,000 jobs in flight at once with a 2 s adapter on one worker process."""

from __future__ import annotations

import asyncio
import sys
import time

from bench.harness import (
    Report,
    dev_temporal,
    peak_rss_mb,
    scratch,
    service,
    submit_many,
    target,
    wait_for_pollers,
    wait_settled,
)

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
CONCURRENCY = 64
TIMEOUT_S = 300


async def main() -> Report:
    report = Report(
        "concurrency",
        {
            "jobs": f"{JOBS}, submitted with {CONCURRENCY} in flight",
            "adapter": "fake, latency_ms=2000",
            "worker": "one `promptjobs worker` process (max_concurrent_activities 1000)",
            "measured": "first POST → last job succeeded (SQLite projection); "
            "worker VmHWM from /proc/PID/status",
        },
    )
    report.start()
    with scratch() as data_dir:
        async with (
            dev_temporal(data_dir) as env,
            service(target(env), data_dir) as (svc, proj, http),
        ):
            worker = svc.spawn("worker")
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
            idle_mb = peak_rss_mb(worker.pid)
            began = time.monotonic()
            await submit_many(http, JOBS, CONCURRENCY, {"options": {"fake": {"latency_ms": 2000}}})
            submitted = time.monotonic() - began
            done, counts = await wait_settled(proj, JOBS, TIMEOUT_S)
            peak_mb = peak_rss_mb(worker.pid)
            report.add("all submitted", f"{submitted:.1f} s")
            report.add("total (first submit → all settled)", f"{done - began:.1f} s", "< 10 s")
            report.add(
                "final states",
                ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                f"succeeded {JOBS}",
            )
            report.add("worker peak RSS (VmHWM)", f"{peak_mb:.0f} MiB (idle {idle_mb:.0f} MiB)")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
