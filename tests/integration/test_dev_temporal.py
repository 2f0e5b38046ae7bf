"""`promptjobs dev`'s Temporal server yields the cores to the API: it runs niced, every thread."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.testing import WorkflowEnvironment

from promptjobs.launch import dev_server_pids, start_dev_temporal
from tests.conftest import free_port, make_settings

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="niceness per thread is read from /proc"
)


def niceness(pid: int) -> set[int]:
    """The niceness of each thread of `pid` (/proc/PID/task/TID/stat, field 19)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        found.add(int(fields[16]))
    return found


async def test_the_dev_temporal_server_runs_at_the_configured_niceness(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path, temporal_address=f"127.0.0.1:{free_port()}", temporal_dev_nice=7
    )
    before = set(dev_server_pids())
    env = await start_dev_temporal(settings, ui=False)
    try:
        ours = [pid for pid in dev_server_pids() if pid not in before]
        assert len(ours) == 1
        assert niceness(ours[0]) == {7}
        # Another dev server of this process (the tests' own) is not its to renice.
        assert before
        assert all(niceness(pid) == {0} for pid in before)
        # It still serves: the workflow service answers.
        assert await env.client.workflow_service.get_system_info(GetSystemInfoRequest())
    finally:
        await env.shutdown()
