"""Live output: the provider's first token → its arrival at an SSE client, with many jobs
streaming at once, and how many output writes each job costs per second at two token rates.

`python -m bench.stream_output [JOBS] [postgresql]`: JOBS jobs (100) stream at once from the
mock provider (OpenAI format, through the real SDK) for about 3 s each, first at 20 tokens/s,
then at 200 tokens/s. API and worker are separate processes, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import httpx

from bench.harness import (
    Report,
    count_in_state,
    dev_temporal,
    free_port,
    ms,
    percentile,
    pg_database,
    scratch,
    service,
    target,
    wait_for_count,
    wait_for_pollers,
)
from promptjobs.runtime import Projection

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 100
POSTGRES = "postgresql" in sys.argv[1:]
# (ms between chunks, chunks): about 3 s of stream each.
RATES = [(50, 60), (5, 600)]


@contextlib.contextmanager
def mock_provider() -> Iterator[str]:
    """`promptjobs mock-provider` in its own process; its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "promptjobs", "mock-provider", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/mock/requests").status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextlib.contextmanager
def database_url() -> Iterator[str | None]:
    if not POSTGRES:
        yield None
        return
    with pg_database() as url:
        yield url


class Watch:
    """One SSE client on everything: when each job's first text arrived, and how many
    output events each job had."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.outputs: Counter[str] = Counter()

    async def follow(self, http: httpx.AsyncClient) -> None:
        event = ""
        async with http.stream("GET", "/v1/events", timeout=None) as response:
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line.removeprefix("event:").strip()
                elif line.startswith("data:") and event == "job.output":
                    arrived = time.time()
                    job_id = json.loads(line.removeprefix("data:"))["job_id"]
                    self.first.setdefault(job_id, arrived)
                    self.last[job_id] = arrived
                    self.outputs[job_id] += 1


@contextlib.asynccontextmanager
async def watching(http: httpx.AsyncClient) -> AsyncIterator[Watch]:
    watch = Watch()
    task = asyncio.create_task(watch.follow(http))
    await asyncio.sleep(0.5)  # the stream starts "from now"
    try:
        yield watch
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def one_rate(
    report: Report,
    http: httpx.AsyncClient,
    mock: str,
    proj: Projection,
    chunk_ms: int,
    chunks: int,
) -> None:
    model = f"mock:chunk_ms={chunk_ms};chunks={chunks}"
    async with watching(http) as watch:
        prompts: dict[str, str] = {}

        async def submit(i: int) -> None:
            prompt = f"stream {i} {uuid.uuid4().hex}"
            body = {"prompt": prompt, "options": {"provider": "openai", "model": model}}
            response = await http.post("/v1/prompts", json=body)
            assert response.status_code == 202, response.text
            prompts[response.json()["job_id"]] = prompt

        done_before = await count_in_state(proj, "succeeded")
        await asyncio.gather(*(submit(i) for i in range(JOBS)))
        await wait_for_count(proj, "succeeded", done_before + JOBS, 300)
        await asyncio.sleep(0.3)
    async with httpx.AsyncClient() as plain:
        seen = (await plain.get(f"{mock}/mock/requests")).json()["requests"]
    first_chunk = {r["prompt"]: r["first_chunk_at"] for r in seen if r["first_chunk_at"]}
    latencies = [
        watch.first[job_id] - first_chunk[prompt]
        for job_id, prompt in prompts.items()
        if job_id in watch.first and prompt in first_chunk
    ]
    # Where the time goes: the first output event's created_at is taken inside the writing
    # transaction (the worker's side ends there; commit, the API's read and delivery follow).
    written = await first_output_written(proj, list(prompts))
    worker_side = [
        written[job_id] - first_chunk[prompt]
        for job_id, prompt in prompts.items()
        if job_id in written and prompt in first_chunk
    ]
    api_side = [
        watch.first[job_id] - written[job_id]
        for job_id in prompts
        if job_id in written and job_id in watch.first
    ]
    # A job's write rate: its output events over the time from its first to its last.
    per_job_per_s = [
        (watch.outputs[job_id] - 1) / (watch.last[job_id] - watch.first[job_id])
        for job_id in prompts
        if watch.outputs[job_id] > 1 and watch.last[job_id] > watch.first[job_id]
    ]
    rate = f"{1000 // chunk_ms} tokens/s"
    report.add(f"{rate}: jobs measured", str(len(latencies)))
    report.add(f"{rate}: first token → SSE p50", ms(percentile(latencies, 50)))
    report.add(f"{rate}: first token → SSE p99", ms(percentile(latencies, 99)), "p99 < 100 ms")
    report.add(
        f"{rate}: of which first token → in the writing transaction (worker) p50/p99",
        f"{ms(percentile(worker_side, 50))} / {ms(percentile(worker_side, 99))}",
    )
    report.add(
        f"{rate}: of which transaction → SSE client (commit, API, client) p50/p99",
        f"{ms(percentile(api_side, 50))} / {ms(percentile(api_side, 99))}",
    )
    report.add(
        f"{rate}: output writes per job per second",
        f"mean {sum(per_job_per_s) / len(per_job_per_s):.1f}, max {max(per_job_per_s):.1f}",
        "≤ 10 (100 ms batches), whatever the token rate",
    )


async def first_output_written(proj: Projection, job_ids: list[str]) -> dict[str, float]:
    """Each job's first `job.output` event's created_at (epoch seconds)."""
    from sqlalchemy import func, select

    from projections.models import JobEvent

    stmt = (
        select(JobEvent.job_id, func.min(JobEvent.id))
        .where(JobEvent.job_id.in_(job_ids), JobEvent.type == "job.output")
        .group_by(JobEvent.job_id)
    )
    async with proj.sessions() as session:
        firsts = [event_id for _, event_id in (await session.execute(stmt)).all()]
        rows = await session.execute(
            select(JobEvent.job_id, JobEvent.created_at).where(JobEvent.id.in_(firsts))
        )
        return {job_id: created.timestamp() for job_id, created in rows.all()}


async def main() -> Report:
    report = Report(
        "streamed output",
        {
            "jobs": f"{JOBS} at once, each streaming ~3 s from the mock provider (openai SDK)",
            "rates": ", ".join(f"{1000 // c} tokens/s ({n} chunks)" for c, n in RATES),
            "store": "PostgreSQL" if POSTGRES else "SQLite",
            "processes": "promptjobs api, promptjobs worker, mock-provider, temporal dev server",
            "first token": "the mock's clock when it sent the first chunk; arrival: the SSE "
            "client's clock (same machine)",
        },
    )
    report.start()
    with scratch() as data_dir, mock_provider() as mock, database_url() as url:
        os.environ["PROMPTJOBS_OPENAI_BASE_URL"] = f"{mock}/v1"
        os.environ["PROMPTJOBS_OPENAI_API_KEY"] = "mock"
        overrides: dict[str, object] = {} if url is None else {"database_url": url}
        async with (
            dev_temporal(data_dir) as env,
            service(target(env), data_dir, **overrides) as (svc, proj, http),
        ):
            svc.spawn("worker")
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
            for chunk_ms, chunks in RATES:
                await one_rate(report, http, mock, proj, chunk_ms, chunks)
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
