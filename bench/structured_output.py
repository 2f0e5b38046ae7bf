"""Structured output: jobs with a JSON schema against a provider that misses on some first
attempts, and the time our validation adds to an answer.

`python -m bench.structured_output [JOBS]`: JOBS jobs (200) with an output schema go to the
mock provider (the openai SDK's wire), which answers text that is no JSON to 30 % of the
prompts (`mock:json_miss_rate=0.3`: a digest of the prompt picks them); each miss runs again
with a repair turn, which the mock answers well. Reported: how many succeeded, attempts per
job, the share of first attempts that missed, and the run's wall time. Then, in this
process, the validation itself (`activities.adapters.structured.check_answer`, what the
worker runs on every answer): p50/p99 per 2 KB answer of a realistic extraction schema, and
the first check of a schema (which compiles its validator once).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

from activities.adapters.structured import OutputSchema, check_answer, compiled_validator
from bench.harness import (
    Report,
    dev_temporal,
    percentile,
    scratch,
    service,
    target,
    wait_for_pollers,
    wait_settled,
)
from bench.stream_output import mock_provider

JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
MISS_RATE = 0.3
CHECKS = 10_000

# An extraction schema of the usual kind: an invoice, its parties and lines.
PARTY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "email": {"type": "string"},
        "country": {"type": "string", "enum": ["DE", "FR", "NL", "US", "GB"]},
    },
    "required": ["name", "country"],
    "additionalProperties": False,
}
LINE = {
    "type": "object",
    "properties": {
        "description": {"type": "string"},
        "quantity": {"type": "integer", "minimum": 1},
        "unit_price": {"type": "number", "minimum": 0},
        "tax_rate": {"type": "number", "enum": [0, 0.07, 0.19, 0.2]},
    },
    "required": ["description", "quantity", "unit_price", "tax_rate"],
    "additionalProperties": False,
}
INVOICE: dict[str, Any] = {
    "type": "object",
    "properties": {
        # No `pattern`: the mock's answers fit types, enums, bounds and lengths, not patterns.
        "number": {"type": "string", "minLength": 1},
        "issued": {"type": "string"},
        "seller": PARTY,
        "buyer": PARTY,
        "lines": {"type": "array", "items": LINE, "minItems": 1, "maxItems": 100},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
        "total": {"type": "number", "minimum": 0},
        "notes": {"type": "string"},
    },
    "required": ["number", "issued", "seller", "buyer", "lines", "currency", "total"],
    "additionalProperties": False,
}


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


def answer_of(size: int) -> str:
    """A valid invoice of about `size` characters of JSON."""
    line = {
        "description": "Consulting, week 12",
        "quantity": 3,
        "unit_price": 120.5,
        "tax_rate": 0.19,
    }
    invoice: dict[str, Any] = {
        "number": "INV-20261207",
        "issued": "2026-12-07",
        "seller": {"name": "Acme GmbH", "email": "billing@acme.example", "country": "DE"},
        "buyer": {"name": "Globex Ltd", "country": "GB"},
        "lines": [],
        "currency": "EUR",
        "total": 0,
    }
    while len(json.dumps(invoice)) < size:
        invoice["lines"].append(line)
    invoice["total"] = 361.5 * len(invoice["lines"])
    return json.dumps(invoice)


def validation(report: Report) -> None:
    wanted = OutputSchema.model_validate({"name": "invoice", "schema": INVOICE})
    answer = answer_of(2048)
    compiled_validator.cache_clear()
    began = time.perf_counter()
    value, miss = check_answer(wanted, answer, "stop")
    first = time.perf_counter() - began
    assert miss is None and value is not None, miss
    times = []
    for _ in range(CHECKS):
        began = time.perf_counter()
        check_answer(wanted, answer, "stop")
        times.append(time.perf_counter() - began)
    report.add(f"check of a {len(answer):,}-character answer, p50", us(percentile(times, 50)))
    report.add(
        f"check of a {len(answer):,}-character answer, p99", us(percentile(times, 99)), "< 1,000 µs"
    )
    report.add("first check of a schema (its validator compiled)", us(first))
    broken = answer.replace('"quantity": 3', '"quantity": 0', 5)
    missed = []
    for _ in range(CHECKS // 10):
        began = time.perf_counter()
        _, miss = check_answer(wanted, broken, "stop")
        missed.append(time.perf_counter() - began)
        assert miss is not None
    report.add("check of the same answer with 5 errors, p99", us(percentile(missed, 99)))


async def run_jobs(report: Report, mock: str) -> None:
    with scratch() as data_dir:
        async with (
            dev_temporal(data_dir) as env,
            service(target(env), data_dir) as (svc, projection, http),
        ):
            svc.spawn("worker")
            await wait_for_pollers(env, svc.settings.temporal_task_queue)
            schema = {"name": "invoice", "schema": INVOICE}
            began = time.monotonic()
            jobs = []
            for i in range(JOBS):
                body = {
                    "prompt": f"extract {i} {uuid.uuid4().hex} mock:json_miss_rate={MISS_RATE}",
                    "options": {"provider": "openai", "output_schema": schema},
                }
                response = await http.post("/v1/prompts", json=body)
                assert response.status_code == 202, response.text
                jobs.append(response.json()["job_id"])
            settled_at, _states = await wait_settled(projection, JOBS, timeout=600)
            took = settled_at - began
            rows = [(await http.get(f"/v1/jobs/{job_id}")).json() for job_id in jobs]
            attempts = [row["attempt"] for row in rows]
            first_missed = 0
            for job_id in jobs:
                records = (await http.get(f"/v1/jobs/{job_id}/attempts")).json()["attempts"]
                first_missed += records[0]["outcome"] == "schema_mismatch"
            succeeded = sum(row["state"] == "succeeded" for row in rows)
            report.add("jobs succeeded", f"{succeeded} of {JOBS}", f"{JOBS}")
            report.add("first attempts that missed", f"{first_missed / JOBS:.0%}")
            report.add("attempts per job, mean", f"{sum(attempts) / JOBS:.2f}")
            report.add("attempts per job, max", str(max(attempts)))
            report.add("submit → all settled", f"{took:.1f} s")


async def main() -> Report:
    report = Report(
        "structured output",
        {
            "jobs": f"{JOBS} with an invoice schema, the mock provider (openai SDK) answering "
            f"text that is no JSON to {MISS_RATE:.0%} of prompts' first attempts",
            "processes": "promptjobs api, promptjobs worker, mock-provider, temporal dev server",
            "validation": f"{CHECKS:,} checks in this process, a compiled validator per schema",
        },
    )
    report.start()
    with mock_provider() as mock:
        os.environ["PROMPTJOBS_OPENAI_BASE_URL"] = f"{mock}/v1"
        os.environ["PROMPTJOBS_OPENAI_API_KEY"] = "mock"
        await run_jobs(report, mock)
    validation(report)
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
