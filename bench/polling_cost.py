"""Polling cost: GET /v1/jobs?since= p99 with 100,000 jobs in the table, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, insert

from bench.harness import Report, ms, percentile, pg_database, scratch, service
from projections.engines import sync_url
from projections.migrate import migrate
from projections.models import Job, Prompt

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
REQUESTS = 300
ORGS = 10  # acme holds 1/ORGS of the rows; alice 1/USERS of acme's
USERS = 10
CHUNK = 5000


def fill(url: str) -> int:
    """Bulk-insert ROWS prompts and succeeded jobs through the migrated schema; alice's count."""
    migrate(url)
    engine = create_engine(sync_url(url))
    base = datetime.now(UTC) - timedelta(days=1)
    alice = 0
    with engine.begin() as conn:
        for start in range(0, ROWS, CHUNK):
            prompts, jobs = [], []
            for i in range(start, min(ROWS, start + CHUNK)):
                org = "acme" if i % ORGS == 0 else f"org{i % ORGS}"
                author = "alice" if (i // ORGS) % USERS == 0 else f"user{(i // ORGS) % USERS}"
                alice += org == "acme" and author == "alice"
                at = base + timedelta(milliseconds=i)
                pid, jid = f"pmt_{uuid.uuid4().hex}", f"job_{uuid.uuid4().hex}"
                prompts.append(
                    {"prompt_id": pid, "org": org, "author": author, "text": f"p {i}",
                     "options": {}, "created_at": at}
                )  # fmt: skip
                jobs.append(
                    {"job_id": jid, "prompt_id": pid, "org": org, "author": author,
                     "state": "succeeded", "priority": 50, "attempt": 1, "max_attempts": 3,
                     "progress_rank": 2, "dispatched_at": at, "last_event_id": i + 1,
                     "created_at": at, "updated_at": at, "started_at": at, "finished_at": at}
                )  # fmt: skip
            conn.execute(insert(Prompt), prompts)
            conn.execute(insert(Job), jobs)
    engine.dispose()
    return alice


async def measure(report: Report, backend: str, url: str, data_dir: Path) -> None:
    began = time.monotonic()
    alice = await asyncio.to_thread(fill, url)
    report.add(f"{backend}: bulk insert {ROWS} jobs", f"{time.monotonic() - began:.1f} s")
    # Reads need no Temporal: the API connects lazily to an address nothing listens on.
    async with service("127.0.0.1:9", data_dir, database_url=url) as (_, _, http):
        cases = {
            "since=0 (first page of 100)": "0",
            "since=tail (a caught-up poll, nothing new)": str(ROWS),
            "since=middle (a page of 100)": str(ROWS // 2),
        }
        for label, since in cases.items():
            latencies = []
            for _ in range(REQUESTS):
                started = time.perf_counter()
                response = await http.get("/v1/jobs", params={"since": since})
                latencies.append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
            report.add(
                f"{backend}: {label} p50 / p99",
                f"{ms(percentile(latencies, 50))} / {ms(percentile(latencies, 99))}",
                "p99 < 20 ms",
            )
    report.add(f"{backend}: alice's jobs among them", str(alice))


async def main() -> Report:
    report = Report(
        "polling cost",
        {
            "rows": f"{ROWS} prompts + {ROWS} succeeded jobs, {ORGS} orgs x {USERS} users",
            "caller": "acme/alice (member): her own jobs only",
            "requests": f"{REQUESTS} sequential per case, real HTTP to a `promptjobs api` process",
            "databases": "SQLite file; PostgreSQL 127.0.0.1:5432, own database, dropped after",
        },
    )
    report.start()
    with scratch() as data_dir:
        sqlite_dir = data_dir / "sqlite"
        sqlite_dir.mkdir()
        await measure(report, "SQLite", f"sqlite:///{sqlite_dir / 'bench.db'}", sqlite_dir)
        with pg_database() as url:
            pg_dir = data_dir / "pg"
            pg_dir.mkdir()
            await measure(report, "PostgreSQL", url, pg_dir)
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
