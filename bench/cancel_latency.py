"""Cancel → the provider's stream closed: how soon a cancelled running job stops costing tokens.

`python -m bench.cancel_latency [JOBS]`: JOBS jobs (20) call the mock provider; each is
cancelled through the API, one after another, and the mock records when the client went away.
Three cases in one run, the default 10 s heartbeat timeout in each: jobs streaming text (a
30 s stream) with the workers' row watch (PROMPTJOBS_CANCEL_WATCH_S, 0.25 s); jobs whose
provider has not answered yet, with the watch; the same with Temporal's heartbeat-delivered
cancellation alone (the watch set to an hour).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx

from bench.harness import (
    Report,
    dev_temporal,
    ms,
    percentile,
    scratch,
    service,
    target,
    wait_for_pollers,
)
from bench.stream_output import mock_provider

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
# A 30 s stream; a provider that has not answered yet (hangs until the client leaves).
STREAMING = "mock:chunk_ms=100;chunks=300"
WAITING = "mock:fail=hang"


async def one_setting(
    report: Report, label: str, watch_s: float, mock: str, model: str = STREAMING
) -> None:
    os.environ["PROMPTJOBS_CANCEL_WATCH_S"] = str(watch_s)
    with scratch() as data_dir:
        async with (
            dev_temporal(data_dir) as env,
            service(target(env), data_dir) as (svc, _proj, http),
            httpx.AsyncClient(base_url=mock) as plain,
        ):
            svc.spawn("worker")
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
            jobs: dict[str, str] = {}
            for i in range(JOBS):
                prompt = f"cancel me {i} {uuid.uuid4().hex}"
                body = {"prompt": prompt, "options": {"provider": "openai", "model": model}}
                response = await http.post("/v1/prompts", json=body)
                assert response.status_code == 202, response.text
                jobs[response.json()["job_id"]] = prompt
            closed: list[float] = []
            settled: list[float] = []
            for job_id, prompt in jobs.items():
                if model == STREAMING:
                    await until(lambda j=job_id: streaming(http, j))
                else:
                    await until(lambda p=prompt: calling(plain, p))
                asked = time.time()
                assert (await http.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
                # Both watched at once: either may come first.
                gone, done = await asyncio.gather(
                    until(lambda p=prompt: went_away(plain, p)),
                    until(lambda j=job_id: is_cancelled(http, j)),
                )
                closed.append(gone - asked)
                settled.append(done - asked)
            report.add(f"{label}: cancel → provider stream closed p50", ms(percentile(closed, 50)))
            report.add(
                f"{label}: cancel → provider stream closed p99",
                ms(percentile(closed, 99)),
                "< 1 s",
            )
            report.add(f"{label}: cancel → row cancelled p50", ms(percentile(settled, 50)))


async def until(
    probe: Callable[[], Awaitable[float | bool | None]], timeout: float = 60.0
) -> float:
    """Poll `probe` every 10 ms: the time it says (a timestamp), or the time it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await probe()
        if found:
            return time.time() if found is True else float(found)
        await asyncio.sleep(0.01)
    raise TimeoutError(f"not within {timeout:g} s")


async def streaming(http: httpx.AsyncClient, job_id: str) -> bool:
    return bool((await http.get(f"/v1/jobs/{job_id}/output")).json()["text"])


async def calling(plain: httpx.AsyncClient, prompt: str) -> bool:
    seen = (await plain.get("/mock/requests")).json()["requests"]
    return any(r["prompt"] == prompt for r in seen)


async def went_away(plain: httpx.AsyncClient, prompt: str) -> float | None:
    seen = (await plain.get("/mock/requests")).json()["requests"]
    found = [r["disconnected_at"] for r in seen if r["prompt"] == prompt]
    return found[0] if found and found[0] is not None else None


async def is_cancelled(http: httpx.AsyncClient, job_id: str) -> bool:
    return bool((await http.get(f"/v1/jobs/{job_id}")).json()["state"] == "cancelled")


async def main() -> Report:
    report = Report(
        "cancel latency",
        {
            "jobs": f"{JOBS}, each a 30 s stream from the mock provider (openai SDK), cancelled "
            "one after another once it has streamed text",
            "processes": "promptjobs api, promptjobs worker, mock-provider, temporal dev server",
            "clock": "the bench's before POST …/cancel; the mock's when the client went away",
        },
    )
    report.start()
    with mock_provider() as mock:
        os.environ["PROMPTJOBS_OPENAI_BASE_URL"] = f"{mock}/v1"
        os.environ["PROMPTJOBS_OPENAI_API_KEY"] = "mock"
        # While text streams, the output writer notices the row too; before the first token
        # only the watch (or Temporal's heartbeat) can.
        await one_setting(report, "streaming, row watch", 0.25, mock)
        await one_setting(report, "before any text, row watch", 0.25, mock, WAITING)
        await one_setting(report, "before any text, heartbeat only", 3600.0, mock, WAITING)
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
