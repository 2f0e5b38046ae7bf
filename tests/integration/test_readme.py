"""The README's examples run as written: its shell and Python blocks, taken from the README
itself, against `promptjobs dev` started as a newcomer starts it (in a fresh folder, on free
ports), from a second shell that did what the banner says (`source .data/env`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually
from tests.integration.processes import DevProcess

README = Path(__file__).resolve().parents[2] / "README.md"
PROMPTJOBS = str(Path(sys.executable).parent / "promptjobs")
# A failed call (4xx, 5xx) fails the example, with the problem's body shown.
STRICT_CURL = 'curl() { command curl --fail-with-body "$@"; }\n'


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def shell_examples() -> str:
    """The curl walk-through first (it defines API and AUTH), then every other sh block that
    calls the API (the chain's)."""
    calls = [block for block in blocks("sh") if "curl" in block]
    assert calls and "source .data/env" in calls[0], calls
    return "\n".join(calls)


@dataclass
class Dev:
    """The newcomer's `promptjobs dev`, and the worker processes it was seen to run."""

    home: Path
    running: DevProcess
    worker_pids: set[int] = field(default_factory=set)


@pytest.fixture(scope="module")
async def dev(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Dev]:
    """`promptjobs dev` in a fresh folder, once its banner is out."""
    home = tmp_path_factory.mktemp("newcomer")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTJOBS_")}
    running = await DevProcess.start(home, env=env)
    try:
        yield Dev(home, running)
    finally:
        await running.stop()


def run_in(home: Path, command: list[str], script: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTJOBS_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return subprocess.run(
        command, input=script, cwd=home, env=env, capture_output=True, text=True, timeout=180
    )


async def test_the_readmes_curl_walk_through_runs_as_written(dev: Dev) -> None:
    script = "set -euo pipefail\n" + STRICT_CURL + shell_examples()
    ran = await asyncio.to_thread(run_in, dev.home, ["bash"], script)
    assert ran.returncode == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    # The live stream of one job ended, after its text and its job.done.
    assert "event: job.output" in ran.stdout and "event: job.done" in ran.stdout
    assert '"cancel_requested_at":"' in ran.stdout
    assert ran.stdout.count('"supersedes":"job_') == 2


async def test_the_readmes_python_example_runs_as_written(dev: Dev) -> None:
    client, sdk = blocks("python")
    for example, prints in ((client, "succeeded [fake:"), (sdk, "completed [fake:")):
        script = f"set -euo pipefail\nsource .data/env\n{sys.executable} - <<'EOF'\n{example}EOF\n"
        ran = await asyncio.to_thread(run_in, dev.home, ["bash"], script)
        assert ran.returncode == 0, (ran.stdout, ran.stderr)
        assert ran.stdout.startswith(prints), ran.stdout


async def test_dev_runs_its_worker_in_a_process_of_its_own(dev: Dev) -> None:
    """As in production: the API's event loop does not share the adapters' streaming (the
    submit latency it bought: bench.dev_latency, bench/README.md)."""
    script = "set -euo pipefail\nsource .data/env\npromptjobs status --json\n"

    async def alive() -> set[int]:
        ran = await asyncio.to_thread(run_in, dev.home, ["bash"], script)
        assert ran.returncode == 0, ran.stderr
        workers = json.loads(ran.stdout)["registered_workers"]
        return {worker["config"]["pid"] for worker in workers if worker["status"] == "alive"}

    # The worker process registers as it starts, after the banner on a loaded machine.
    pids = await eventually(alive, bool, timeout=30, interval=0.5)
    assert dev.running.process.pid not in pids, pids
    dev.worker_pids = pids
    # Its counters are its own, on the port the banner names.
    [url] = [line.split()[0] for line in dev.running.printed if line.rstrip().endswith("(worker)")]
    async with httpx.AsyncClient() as http:
        scraped = (await http.get(url)).text
    assert 'promptjobs_job_transitions_total{error_kind="",state="succeeded"}' in scraped


async def test_the_dev_console_stays_quiet_through_the_walk_through(dev: Dev) -> None:
    """Last (it stops dev): the walk-through cancelled a running job, which is expected, so
    nothing on the console looks like an error (Temporal core's "Activity not found on
    completion" warning is lowered to debug)."""
    printed = await dev.running.stop()
    assert dev.running.process.returncode == 0
    for pid in dev.worker_pids:  # its worker stopped with it
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    after_banner = printed.split("source ", 1)[1]
    assert "Activity not found" not in after_banner, after_banner
    assert "WARN" not in after_banner and "Traceback" not in after_banner, after_banner
