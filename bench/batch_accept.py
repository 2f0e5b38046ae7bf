"""A batch's acceptance: from `POST /v1/batches` to every line of its input file accepted as
a job (the batch `in_progress`), for a file of N chat lines, and the API's peak RSS while it
reads the file. No worker runs: this measures the front door, not the jobs."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from bench.harness import Report, args, bench_stack, ms, service, target

# [LINES] [postgresql]
ARGS = args(default_count=10_000)


def rss_mb(pid: int, field: str) -> float:
    """VmRSS (now) or VmHWM (the peak so far) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def input_file(lines: int) -> bytes:
    body = {
        "model": "fake/any",
        "messages": [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "Summarise ticket {n}: the printer on floor 3 jams."},
        ],
        "max_tokens": 200,
    }
    rows = []
    for n in range(lines):
        message = dict(body["messages"][1])  # type: ignore[index]
        message["content"] = message["content"].format(n=n)
        line_body = {**body, "messages": [body["messages"][0], message]}  # type: ignore[index]
        rows.append(
            json.dumps(
                {
                    "custom_id": f"ticket-{n}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": line_body,
                }
            )
        )
    return ("\n".join(rows) + "\n").encode()


async def main() -> Report:
    content = input_file(ARGS.count)
    report = Report(
        "batch acceptance",
        {
            "lines": f"{ARGS.count:,} chat lines, {len(content) / 1e6:.1f} MB",
            "stack": f"promptjobs api (no worker), {ARGS.backend} projection, dev server on disk",
            "client": "httpx in the bench process",
        },
    )
    report.start()
    async with (
        bench_stack(ARGS) as (data_dir, env, overrides),
        service(target(env), data_dir, **overrides) as (svc, _, http),
    ):
        api = svc.processes[0].pid
        before = rss_mb(api, "VmRSS")
        started = time.monotonic()
        uploaded = await http.post(
            "/v1/files",
            files={"file": ("input.jsonl", content, "application/jsonl")},
            data={"purpose": "batch"},
        )
        uploaded.raise_for_status()
        upload_s = time.monotonic() - started
        created_at = time.monotonic()
        batch = (
            await http.post(
                "/v1/batches",
                json={
                    "input_file_id": uploaded.json()["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
            )
        ).json()
        deadline = created_at + 1800
        while time.monotonic() < deadline:
            batch = (await http.get(f"/v1/batches/{batch['id']}")).json()
            if batch["status"] != "validating":
                break
            await asyncio.sleep(0.1)
        accepted_s = time.monotonic() - created_at
        peak = rss_mb(api, "VmHWM")
        report.add(
            "upload (POST /v1/files)", f"{ms(upload_s)} ({len(content) / 1e6 / upload_s:.1f} MB/s)"
        )
        report.add(
            "batches.create → all lines accepted",
            f"{accepted_s:.1f} s ({ARGS.count / accepted_s:,.0f} lines/s), "
            f"status {batch['status']}",
        )
        report.add(
            "API RSS",
            f"{before:.0f} MiB before the upload, peak {peak:.0f} MiB "
            f"(the file: {len(content) / 2**20:.0f} MiB)",
        )
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
    sys.exit(0)
