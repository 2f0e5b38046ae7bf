"""A provider batch's memory: a worker's peak RSS while it sends one batch of N deferrable jobs
(each with a prompt of KB kilobytes) to the mock's OpenAI Batch API and settles every job from
its result line.

    .venv/bin/python -m bench.provider_batch_memory [N] [KB]

The batch's activities run in this process, as a worker runs them (through Temporal's
ActivityEnvironment, its signals to the jobs' workflows going to a dev server that has none);
the jobs are written straight to a SQLite projection first. The peak is measured from a reset
after that set-up (/proc/self/clear_refs), so it is what the send and the settle add.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
from temporalio.testing import ActivityEnvironment

from activities.contracts import ProviderBatchRef
from activities.prices import PriceTable
from activities.provider_batches import BatchActivities
from bench.harness import (
    Report,
    bench_settings,
    count_in_state,
    dev_temporal,
    mock_provider,
    scratch,
)
from projections.domain.lifecycle import JobState
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.wiring import build_adapters, open_projection

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
PROMPT_KB = int(sys.argv[2]) if len(sys.argv) > 2 else 10
OWNER = Scope("acme", "alice")
MODEL = "mock-model"


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak since the last reset) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


async def main() -> Report:
    report = Report(
        "provider batch memory",
        {
            "batch": f"{COUNT:,} deferrable jobs, prompts of {PROMPT_KB} KB "
            f"({COUNT * PROMPT_KB / 1024:.0f} MiB in all)",
            "stack": "the batch's activities in this process, SQLite, the mock's Batch API",
        },
    )
    report.start()
    with scratch() as data_dir:
        async with mock_provider() as url, dev_temporal(data_dir) as temporal:
            async with httpx.AsyncClient(base_url=url) as admin:
                (await admin.put("/mock/batches", json={"run_s": 0})).raise_for_status()
            settings = bench_settings(
                data_dir, openai_base_url=f"{url}/v1", openai_api_key="mock", batch_max_jobs=COUNT
            )
            async with open_projection(settings) as projection:
                store = projection.store
                options = {"provider": "openai", "model": MODEL, "deferrable": True}
                filler = "x" * (PROMPT_KB * 1024)
                for i in range(COUNT):
                    accepted = await store.submit(
                        OWNER, Submission(f"ticket {i} {filler}", 50, 3, dict(options))
                    )
                    await store.provider_batches.defer(accepted.job, "openai", MODEL)
                [batch] = await store.provider_batches.gather(COUNT, 0)
                activities = BatchActivities(
                    store, build_adapters(settings), settings.backoff, PriceTable.load(None)
                )
                run = ActivityEnvironment(client=temporal.client).run
                ref = ProviderBatchRef(batch.batch_id)
                base = rss_mb("VmRSS")
                reset_peak()
                began = time.monotonic()
                sent = await run(activities.submit_provider_batch, ref)
                send_s = time.monotonic() - began
                send_peak = rss_mb("VmHWM")
                assert sent.provider_batch_id, sent
                for _ in range(600):
                    if (await run(activities.poll_provider_batch, ref)).ended:
                        break
                    await asyncio.sleep(0.5)
                settle_base = rss_mb("VmRSS")
                reset_peak()
                began = time.monotonic()
                settled = await run(activities.settle_provider_batch, ref)
                settle_s = time.monotonic() - began
                settle_peak = rss_mb("VmHWM")
                succeeded = await count_in_state(projection, JobState.SUCCEEDED.value)
    report.add("jobs settled (succeeded)", f"{settled.settled:,} ({succeeded:,})")
    report.add("RSS before sending", f"{base:.0f} MiB")
    report.add("send: peak RSS over that", f"+{send_peak - base:.0f} MiB in {send_s:.1f} s")
    report.add(
        "settle: peak RSS over the RSS before it",
        f"+{settle_peak - settle_base:.0f} MiB in {settle_s:.1f} s",
    )
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
