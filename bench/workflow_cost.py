"""Workflow cost: the worker's CPU for one job's workflow tasks alone, without a server.

Replays one recorded history (tests/replay/histories) N times through the sandbox, as a
worker runs it: each replay creates the workflow's instance (the sandbox imports the workflow
module afresh) and runs its activations. Three rounds; milliseconds per workflow."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from bench.harness import Report
from workflows.prompt_job import PromptJobWorkflow

HISTORY = sys.argv[1] if len(sys.argv) > 1 else "v7-success.json"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 300
HISTORIES = Path(__file__).resolve().parents[1] / "tests" / "replay" / "histories"


async def main() -> Report:
    report = Report(
        "workflow cost",
        {"history": HISTORY, "replays": f"{N} per round, 3 rounds, one Replayer (sandboxed)"},
    )
    report.start()
    recorded = WorkflowHistory.from_json("recorded", (HISTORIES / HISTORY).read_text())
    replayer = Replayer(workflows=[PromptJobWorkflow])
    for round_ in range(1, 4):

        async def copies(r: int = round_) -> AsyncIterator[WorkflowHistory]:
            for i in range(N):
                yield WorkflowHistory(f"replay-{r}-{i}", recorded.events)

        began = time.perf_counter()
        await replayer.replay_workflows(copies(), raise_on_replay_failure=True)
        per = (time.perf_counter() - began) / N
        report.add(f"round {round_}", f"{per * 1000:.2f} ms per workflow replayed")
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
