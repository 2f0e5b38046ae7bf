"""Projection transitions/s with 1, 2 and 4 writer processes, SQLite and PostgreSQL.

The projection alone (no Temporal, no HTTP): each writer process is a worker's projector
(`Projector`, its GroupCommit, a synchronous connection) driving its share of the jobs
through four transitions each (started, re-queued, started again, succeeded) with
CONCURRENCY attempts in flight, as a busy worker's activities do. On PostgreSQL the writers
commit concurrently; on SQLite they take turns (one writer).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

from bench.harness import Report, bench_settings, pg_database, scratch
from projections.domain.lifecycle import AttemptResult, ErrorKind, JobState
from projections.projector import Transition
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import open_projection

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 1200
CONCURRENCY = 32
WRITERS = (1, 2, 4)
ALICE = Scope("acme", "alice", "member")
ANSWER = AttemptResult(text="ok", provider="fake", model="fake-1")


async def drive(url: str, data_dir: Path, jobs: list[str], start: Barrier) -> float:
    settings = bench_settings(data_dir, database_url=url)
    async with open_projection(settings, run_migrations=False) as projection:
        projector = projection.projector
        pending = iter(jobs)

        async def attempts() -> None:
            for job_id in pending:
                await projector.start_attempt(job_id, 1, "bench")
                await projector.apply(
                    Transition(job_id, JobState.QUEUED, 1, error_kind=ErrorKind.TIMEOUT)
                )
                await projector.start_attempt(job_id, 2, "bench")
                assert (await projector.succeed(job_id, 2, f"rsp_{job_id}", ANSWER)).applied

        await asyncio.to_thread(start.wait)
        began = time.monotonic()
        await asyncio.gather(*(attempts() for _ in range(CONCURRENCY)))
        return time.monotonic() - began


def writer(url: str, data_dir: Path, jobs: list[str], start: Barrier, out: object) -> None:
    elapsed = asyncio.run(drive(url, data_dir, jobs, start))
    out.put(elapsed)  # type: ignore[attr-defined]


async def submitted(url: str, data_dir: Path) -> list[str]:
    async with open_projection(bench_settings(data_dir, database_url=url)) as projection:
        store = projection.store
        accepted = await asyncio.gather(
            *(store.submit(ALICE, Submission(f"p{i}", 50, 3, {})) for i in range(JOBS))
        )
        return [a.job.job_id for a in accepted]


def run_once(url: str, data_dir: Path, processes: int) -> float:
    """Transitions/s of `processes` writers sharing JOBS fresh jobs."""
    jobs = asyncio.run(submitted(url, data_dir))
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(processes + 1)
    out = spawn.Queue()
    procs = [
        spawn.Process(target=writer, args=(url, data_dir, jobs[i::processes], start, out))
        for i in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        start.wait(timeout=120)
        elapsed = max(out.get(timeout=600) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return 4 * len(jobs) / elapsed


def main() -> None:
    report = Report(
        "projection writers",
        {"jobs per run": JOBS, "transitions per job": 4, "in flight per writer": CONCURRENCY},
    )
    report.start()
    for backend in ("sqlite", "postgresql"):
        for processes in WRITERS:
            with scratch() as data_dir:
                if backend == "sqlite":
                    rate = run_once(f"sqlite:///{data_dir / 'bench.db'}", data_dir, processes)
                else:
                    with pg_database() as url:
                        rate = run_once(url, data_dir, processes)
            report.add(f"{backend}, {processes} writer process(es)", f"{rate:.0f} transitions/s")
    report.print()


if __name__ == "__main__":
    main()
