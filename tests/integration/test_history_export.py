"""`promptjobs history export` writes a job's workflow history as the Replayer reads it (a
real dev server, a real job, the CLI in a process of its own)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from tests.conftest import Stack
from workflows.prompt_job import PromptJobWorkflow


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, json.loads(path.read_text()))


async def test_cli_history_export_replays(stack: Stack, tmp_path: Path) -> None:
    job_id = (await stack.submit("export me"))["job_id"]
    await stack.settled(job_id)
    await stack.client.get_workflow_handle(job_id).result()
    output = tmp_path / "history.json"
    env = {
        **os.environ,
        "PROMPTJOBS_TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
    }
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "promptjobs", "history", "export", job_id, "-o", str(output),
        env=env,
    )  # fmt: skip
    assert await done.wait() == 0
    result = await Replayer(workflows=[PromptJobWorkflow]).replay_workflow(load(output))
    assert result.replay_failure is None


async def test_cli_history_export_of_an_unknown_job_is_one_line(stack: Stack) -> None:
    env = {
        **os.environ,
        "PROMPTJOBS_TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
    }
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "promptjobs", "history", "export", "job_nope",
        env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await done.communicate()
    assert done.returncode == 1
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read the history of job_nope")
