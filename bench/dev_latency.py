"""Submit latency against `promptjobs dev` itself, as a newcomer runs it: POST /v1/prompts
p50/p99 at concurrency 1 and 32 while the submitted 2 s fake jobs stream their answers.

    .venv/bin/python -m bench.dev_latency [httpx | httpx2]

Starts `promptjobs dev --no-ui` in a scratch folder on free ports, loads it over HTTP from
this process (aiohttp, keep-alive; `httpx`: an httpx client, as many users' code sends it;
`httpx2`: the fork the `openai` and `anthropic` SDKs send with),
stops it with Ctrl-C's signal."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from pathlib import Path

import httpx

from bench.harness import Report, client_of, free_port, ms, percentile, submit_many

REQUESTS = {1: 300, 32: 960}
WARMUP = 20
BODY: dict[str, object] = {"options": {"fake": {"latency_ms": 2000}}}
PROMPTJOBS = str(Path(sys.executable).parent / "promptjobs")
CLIENT = client_of(sys.argv[1:])


async def main() -> Report:
    report = Report(
        "submit latency against promptjobs dev",
        {
            "requests": f"{REQUESTS} (concurrency: count), after {WARMUP} warm-up "
            "requests and, each phase, as many at once as it has in flight (a warm pool)",
            "adapter": "fake, latency_ms=2000 (streams a word at a time)",
            "stack": "`promptjobs dev --no-ui` as shipped, SQLite, in a scratch folder",
            "client": f"{CLIENT} in the bench process, keep-alive",
        },
    )
    report.start()
    with tempfile.TemporaryDirectory(prefix="promptjobs-dev-bench-") as scratch:
        api_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTJOBS_")}
        dev = await asyncio.create_subprocess_exec(
            PROMPTJOBS, "dev", "--no-ui",
            "--api-port", str(api_port), "--temporal-port", str(free_port()),
            "--data-dir", str(Path(scratch) / "data"),
            cwd=scratch, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert dev.stdout is not None
        drain: asyncio.Task[bytes] | None = None
        try:
            async with asyncio.timeout(120):
                while b"source " not in (line := await dev.stdout.readline()):
                    assert line, "promptjobs dev exited before its banner"
            drain = asyncio.create_task(dev.stdout.read())
            key = (Path(scratch) / "data" / "dev-api-key").read_text().strip()
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{api_port}",
                headers={"Authorization": f"Bearer {key}"},
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            ) as http:
                await submit_many(http, WARMUP, 1, BODY)
                for concurrency, n in REQUESTS.items():
                    latencies = await submit_many(
                        http, n, concurrency, BODY, client=CLIENT, warm=True
                    )
                    goal = "p99 < 25 ms" if concurrency == 1 else "p99 < 100 ms"
                    report.add(f"c={concurrency} p50", ms(percentile(latencies, 50)))
                    report.add(f"c={concurrency} p99", ms(percentile(latencies, 99)), goal)
        finally:
            if dev.returncode is None:
                dev.send_signal(signal.SIGINT)
                try:
                    async with asyncio.timeout(60):
                        await dev.wait()
                except TimeoutError:
                    dev.kill()
                    await dev.wait()
            if drain is not None:
                drain.cancel()
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
    sys.exit(0)
