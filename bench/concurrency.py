"""Concurrency: 1,000 jobs in flight at once with a 2 s adapter on one worker, next to bare
Temporal running the same number of one-activity workflows (a 2 s activity) on the same server."""

from __future__ import annotations

import asyncio
import time

from bench.bare import bare_temporal
from bench.harness import (
    CpuMeter,
    Report,
    args,
    bench_stack,
    peak_rss_mb,
    service,
    submit_many,
    target,
    wait_for_pollers,
    wait_settled,
)

# [JOBS] [postgresql] [embedded] [pinned]
ARGS = args(default_count=1000)
JOBS = ARGS.count
CONCURRENCY = 64
TIMEOUT_S = 300
LATENCY_S = 2.0


async def main() -> Report:
    report = Report(
        "concurrency",
        {
            "jobs": f"{JOBS}, submitted with {CONCURRENCY} in flight",
            "adapter": f"fake, latency_ms={LATENCY_S * 1000:g}",
            "promptjobs": f"{ARGS.stack} (max_concurrent_activities 1000)",
            "bare Temporal": f"{JOBS} one-activity workflows, a {LATENCY_S:g} s activity, "
            f"started {CONCURRENCY} at a time, one worker process; same server, first",
            "measured": "first submit → last job succeeded; worker VmHWM from /proc/PID/status",
        },
    )
    report.start()
    async with bench_stack(ARGS) as (data_dir, env, overrides):
        bare_s, bare_cpu = await bare_temporal(env, JOBS, CONCURRENCY, sleep_s=LATENCY_S)
        report.add("bare Temporal (first start → all completed)", f"{bare_s:.1f} s")
        report.add("bare Temporal, CPU", bare_cpu)
        async with service(target(env), data_dir, embedded=ARGS.embedded, **overrides) as (
            svc,
            proj,
            http,
        ):
            worker = svc.start_worker()
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
            idle_mb = peak_rss_mb(worker.pid)
            meter = CpuMeter()
            began = time.monotonic()
            body: dict[str, object] = {"options": {"fake": {"latency_ms": LATENCY_S * 1000}}}
            await submit_many(http, JOBS, CONCURRENCY, body)
            submitted = time.monotonic() - began
            done, counts = await wait_settled(proj, JOBS, TIMEOUT_S)
            total = done - began
            peak_mb = peak_rss_mb(worker.pid)
            report.add("all submitted", f"{submitted:.1f} s")
            report.add(
                "total (first submit → all settled)",
                f"{total:.1f} s = {total / bare_s:.2f}x bare",
                "≤ 1.2x bare",
            )
            report.add("CPU", meter.per(JOBS))
            report.add(
                "final states",
                ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                f"succeeded {JOBS}",
            )
            report.add("worker peak RSS (VmHWM)", f"{peak_mb:.0f} MiB (idle {idle_mb:.0f} MiB)")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
