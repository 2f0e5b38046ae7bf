"""The submit path's projection writes alone: submits/s and per-call latency at c=32.

No HTTP and no Temporal: `JobStore.submit` (the acceptance transaction) and then
`JobStore.mark_dispatched` (the dispatcher's note that a workflow started) for each job,
CONCURRENCY calls in flight, as a burst of POST /v1/prompts and the dispatcher behind it
drive them. Both share transactions (GroupCommit). SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

from bench.harness import Report, bench_settings, ms, percentile, pg_database, scratch
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import open_projection

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
CONCURRENCY = 32
ALICE = Scope("acme", "alice", "member")


async def timed(calls: list[Callable[[], Awaitable[object]]]) -> tuple[float, list[float]]:
    """Run `calls` CONCURRENCY at a time: elapsed seconds and each call's latency."""
    latencies: list[float] = []
    pending = iter(calls)

    async def caller() -> None:
        for call in pending:
            started = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    return time.perf_counter() - began, latencies


async def run(url: str, report: Report, backend: str) -> None:
    with scratch() as data_dir:
        async with open_projection(bench_settings(data_dir, database_url=url)) as projection:
            store = projection.store
            job_ids: list[str] = []

            async def submit(i: int) -> None:
                accepted = await store.submit(ALICE, Submission(f"bench {i}", 50, 3, {}))
                job_ids.append(accepted.job.job_id)

            elapsed, latencies = await timed([lambda i=i: submit(i) for i in range(JOBS)])
            report.add(f"{backend} submit", f"{JOBS / elapsed:.0f}/s")
            report.add(f"{backend} submit p50 / p99", f"{ms(percentile(latencies, 50))} / "
                       f"{ms(percentile(latencies, 99))}")  # fmt: skip
            elapsed, latencies = await timed(
                [lambda j=j: store.mark_dispatched(j) for j in job_ids]
            )
            report.add(f"{backend} mark_dispatched", f"{JOBS / elapsed:.0f}/s")
            report.add(f"{backend} mark_dispatched p50 / p99", f"{ms(percentile(latencies, 50))}"
                       f" / {ms(percentile(latencies, 99))}")  # fmt: skip


async def main() -> Report:
    report = Report("submit writes", {"jobs": JOBS, "in flight": CONCURRENCY})
    report.start()
    with scratch() as data_dir:
        await run(f"sqlite:///{data_dir / 'bench.db'}", report, "sqlite")
    with pg_database() as url:
        await run(url, report, "postgresql")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
