"""Provider rate limits: a burst of 4x a provider's per-minute limit, against the mock provider
in rate-limit mode (`promptjobs mock-provider --rpm N --tpm N`), with no budget configured:
the workers learn the limits from the provider's headers.

    .venv/bin/python -m bench.rate_limit [MULTIPLE] [quick]

For each case: jobs that ended failed, 429s as a share of the provider calls, and the drain
time (first submit → last job settled) against the ideal: the provider's limit lets a minute's
worth through at once, then a minute's worth each minute, so the last of N jobs can start no
sooner than (ceil(N / per minute) - 1) minutes after the first. Goals (issue 31): 0 failed, ≤ 2 %
429s, ≤ 1.1x the ideal. `quick` runs the first case only.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness import (
    LOGS,
    Args,
    Report,
    bench_stack,
    mock_provider,
    service,
    target,
    wait_for_pollers,
    wait_settled,
)

WORDS = [w for w in sys.argv[1:] if w != "quick"]
MULTIPLE = int(WORDS[0]) if WORDS else 4
QUICK = "quick" in sys.argv[1:]
TIMEOUT_S = 900


@dataclass(frozen=True)
class Case:
    name: str
    provider: str
    workers: int
    rpm: int | None
    tpm: int | None
    # Words of each prompt: the mock counts a word as a token, and answers the prompt's words
    # and one more, so a job costs about 2 x words + 1 tokens.
    words: int = 3

    @property
    def per_minute(self) -> int:
        """How many jobs the provider's limits let through in a minute."""
        limits = []
        if self.rpm is not None:
            limits.append(self.rpm)
        if self.tpm is not None:
            limits.append(self.tpm // self.tokens_per_job)
        return min(limits)

    @property
    def tokens_per_job(self) -> int:
        return 2 * (self.words + 1) + 1  # "burst N <words>", and the answer: the same and a digest

    @property
    def jobs(self) -> int:
        return MULTIPLE * self.per_minute

    @property
    def ideal_s(self) -> float:
        return (math.ceil(self.jobs / self.per_minute) - 1) * 60.0


CASES = [
    Case("openai, 60 requests/min, 1 worker", "openai", 1, rpm=60, tpm=None),
    Case("openai, 60 requests/min, 3 workers", "openai", 3, rpm=60, tpm=None),
    Case("anthropic, 60 requests/min, 1 worker", "anthropic", 1, rpm=60, tpm=None),
    # Token-bound: 600 tokens a minute, each job 41 tokens, so 14 a minute fit.
    Case("openai, 600 tokens/min (long prompts), 1 worker", "openai", 1, rpm=1000, tpm=600,
         words=19),
]  # fmt: skip


@dataclass
class Outcome:
    drain_s: float
    states: dict[str, int]
    requests: int
    rate_limited: int


def mock_args(case: Case) -> list[str]:
    """The mock's rate-limit mode for the case."""
    args = []
    if case.rpm is not None:
        args += ["--rpm", str(case.rpm)]
    if case.tpm is not None:
        args += ["--tpm", str(case.tpm)]
    return args


async def run_case(case: Case) -> Outcome:
    async with mock_provider(*mock_args(case)) as url:
        env = {
            "PROMPTJOBS_OPENAI_BASE_URL": f"{url}/v1",
            "PROMPTJOBS_OPENAI_API_KEY": "mock",
            "PROMPTJOBS_ANTHROPIC_BASE_URL": url,
            "PROMPTJOBS_ANTHROPIC_API_KEY": "mock",
        }
        async with bench_stack(Args(0, "sqlite", False)) as (data_dir, temporal, overrides):
            async with service(target(temporal), data_dir, extra_env=env, **overrides) as (
                svc,
                projection,
                http,
            ):
                for _ in range(case.workers):
                    svc.spawn("worker")
                await wait_for_pollers(temporal, svc.settings.temporal_task_queue, case.workers)
                filler = " ".join(["word"] * (case.words - 1))
                began = time.monotonic()
                for i in range(case.jobs):
                    body = {
                        "prompt": f"burst {i} {filler}".strip(),
                        "options": {"provider": case.provider, "model": "mock-model"},
                    }
                    accepted = await http.post("/v1/prompts", json=body)
                    accepted.raise_for_status()
                done, states = await wait_settled(projection, case.jobs, TIMEOUT_S)
        async with httpx.AsyncClient(base_url=url) as admin:
            seen = (await admin.get("/mock/limits")).json()
        return Outcome(done - began, states, int(seen["requests"]), int(seen["rate_limited"]))


async def main() -> Report:
    cases = CASES[:1] if QUICK else CASES
    report = Report(
        "rate_limit",
        {
            "burst": f"{MULTIPLE}x the per-minute limit, submitted at once",
            "provider": "promptjobs mock-provider in rate-limit mode (sliding minute, 429 with "
            "retry-after, rate-limit headers); no budget configured: learned",
            "stack": "promptjobs api + N promptjobs worker processes, SQLite projection",
            "cases": "; ".join(c.name for c in cases),
        },
    )
    report.start()
    for case in cases:
        outcome = await run_case(case)
        failed = outcome.states.get("failed", 0)
        share = outcome.rate_limited / max(outcome.requests, 1)
        report.add(f"{case.name}: jobs", f"{case.jobs} ({case.per_minute} a minute)")
        report.add(
            f"{case.name}: final states",
            ", ".join(f"{k} {v}" for k, v in sorted(outcome.states.items())),
            "0 failed" if failed == 0 else f"0 failed (got {failed})",
        )
        report.add(
            f"{case.name}: 429s / provider calls",
            f"{outcome.rate_limited} / {outcome.requests} = {share:.1%}",
            "≤ 2 %",
        )
        ratio = outcome.drain_s / case.ideal_s if case.ideal_s else float("nan")
        report.add(
            f"{case.name}: drain",
            f"{outcome.drain_s:.1f} s vs ideal {case.ideal_s:.0f} s = {ratio:.2f}x",
            "≤ 1.1x",
        )
    return report


if __name__ == "__main__":
    Path(LOGS).mkdir(parents=True, exist_ok=True)
    asyncio.run(main()).print()
