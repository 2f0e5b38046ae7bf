"""Deferrable jobs in provider batches (issue 33): N jobs run directly, then N deferrable
jobs, against the mock provider (its OpenAI Batch API runs a batch 1 s after it is sent).

    .venv/bin/python -m bench.provider_batches [N] [postgresql]

For each: the provider calls it took (direct requests, batch lines, provider batches), the
cost of the whole run by a price table of $1/$4 per million input/output tokens (the batch
rate half), and the drain time (first submit → last job settled). The deferrable drain is
bound by the gathering wait and the batch's own run, not by our throughput: it is here to
show what a batch costs in time, and that nothing runs directly.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx
from sqlalchemy import func, select

from bench.harness import (
    LOGS,
    Report,
    args,
    bench_stack,
    mock_provider,
    service,
    target,
    wait_for_pollers,
    wait_settled,
)
from projections.models import Job
from promptjobs.wiring import Projection

ARGS = args(default_count=1000)
TIMEOUT_S = 900
PRICES = '[models."mock-model"]\ninput = 1.0\noutput = 4.0\n'


async def cost(projection: Projection) -> float:
    async with projection.sessions() as session:
        total = await session.execute(select(func.sum(Job.cost_usd)))
        return float(total.scalar() or 0.0)


async def run(deferrable: bool, prices: Path) -> dict[str, object]:
    async with mock_provider() as url:
        env = {
            "PROMPTJOBS_OPENAI_BASE_URL": f"{url}/v1",
            "PROMPTJOBS_OPENAI_API_KEY": "mock",
            "PROMPTJOBS_PRICES_FILE": str(prices),
            "PROMPTJOBS_BATCH_MAX_WAIT_S": "2",
            "PROMPTJOBS_BATCH_POLL_S": "1",
        }
        async with (
            bench_stack(ARGS) as (data_dir, temporal, overrides),
            service(target(temporal), data_dir, extra_env=env, **overrides) as (
                svc,
                projection,
                http,
            ),
        ):
            svc.spawn("worker")
            await wait_for_pollers(temporal, svc.settings.temporal_task_queue, 1)
            options: dict[str, object] = {"provider": "openai", "model": "mock-model"}
            if deferrable:
                options["deferrable"] = True
            began = time.monotonic()
            for i in range(ARGS.count):
                body = {"prompt": f"summarise ticket {i}", "options": options}
                (await http.post("/v1/prompts", json=body)).raise_for_status()
            done, states = await wait_settled(projection, ARGS.count, TIMEOUT_S)
            spent = await cost(projection)
        async with httpx.AsyncClient(base_url=url) as admin:
            seen = (await admin.get("/mock/requests")).json()["requests"]
    batched = Counter(r["batch"] for r in seen if r.get("batch"))
    return {
        "drain_s": done - began,
        "states": dict(states),
        "direct": sum(1 for r in seen if not r.get("batch")),
        "lines": sum(batched.values()),
        "batches": len(batched),
        "cost": spent,
    }


async def main() -> Report:
    report = Report(
        "provider_batches",
        {
            "jobs": f"{ARGS.count} openai jobs, direct then deferrable",
            "provider": "promptjobs mock-provider (its Batch API runs a batch 1 s after it "
            "is sent)",
            "stack": f"promptjobs api + 1 promptjobs worker, {ARGS.backend} projection; "
            "BATCH_MAX_WAIT_S 2, BATCH_POLL_S 1, BATCH_MAX_JOBS 1000",
        },
    )
    report.start()
    LOGS.mkdir(parents=True, exist_ok=True)
    prices = LOGS / "prices.toml"
    prices.write_text(PRICES)
    for deferrable in (False, True):
        name = "deferrable" if deferrable else "direct"
        outcome = await run(deferrable, prices)
        states = outcome["states"]
        assert isinstance(states, dict)
        report.add(
            f"{name}: final states", ", ".join(f"{k} {v}" for k, v in sorted(states.items()))
        )
        report.add(
            f"{name}: provider calls",
            f"{outcome['direct']} direct, {outcome['lines']} batch lines in "
            f"{outcome['batches']} provider batches",
        )
        report.add(f"{name}: cost", f"${outcome['cost']:.6f}")
        report.add(f"{name}: drain", f"{outcome['drain_s']:.1f} s")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
