"""Recorded histories of every path replay against today's PromptJobWorkflow.

A change that breaks determinism for jobs already in flight fails here, naming the history.
Record a new set with `python -m tests.replay.record_histories` (docs/workflow-versioning.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from promptjobs.runtime import workflow_runner
from workflows.contracts import PromptJobInput, PromptJobResult
from workflows.prompt_job import PromptJobWorkflow
from workflows.provider_batch import ProviderBatchWorkflow
from workflows.retention import RetentionWorkflow
from workflows.webhook_delivery import WebhookDeliveryWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
RETENTION_HISTORIES = sorted((Path(__file__).parent / "histories" / "retention").glob("*.json"))
BATCH_HISTORIES = sorted((Path(__file__).parent / "histories" / "provider_batch").glob("*.json"))
WEBHOOK_HISTORIES = sorted(
    (Path(__file__).parent / "histories" / "webhook_delivery").glob("*.json")
)
PATHS = {
    "success", "retry_then_success", "exhausted", "non_retryable", "rate_limited",
    "cancel_queued", "cancel_running", "crash_recovery", "stuck", "scheduled",
    "chain_waits_then_runs", "chain_parent_retried", "chain_cancel_waiting",
    "chain_stuck_waiting",
    "restarted", "closed_failed", "org_slot_wait", "budget_wait",
    "deferred_direct", "deferred_batch", "deferred_line_failed",
}  # fmt: skip
# Since the patch fail-failed-jobs (v3 on) a failed job's workflow ends Failed.
FAILED_PATHS = {"exhausted", "non_retryable", "stuck", "closed_failed"}


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, json.loads(path.read_text()))


async def all_histories() -> AsyncIterator[WorkflowHistory]:
    for path in HISTORIES:
        yield load(path)


async def replays(path: Path, workflow: type) -> None:
    """The recorded history at `path` replays on today's `workflow`."""
    result = await Replayer(workflows=[workflow]).replay_workflow(
        load(path), raise_on_replay_failure=False
    )
    assert result.replay_failure is None, (
        f"{path.name} no longer replays on {workflow.__name__}: guard the change with "
        f"workflow.patched() (docs/workflow-versioning.md). Cause: {result.replay_failure}"
    )


def test_every_path_has_a_recorded_history() -> None:
    recorded = {path.stem.split("-", 1)[1] for path in HISTORIES}
    assert PATHS <= recorded, f"missing histories: {sorted(PATHS - recorded)}"


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_on_the_current_workflow(path: Path) -> None:
    result = await Replayer(workflows=[PromptJobWorkflow]).replay_workflow(
        load(path), raise_on_replay_failure=False
    )
    assert result.replay_failure is None, (
        f"{path.name} no longer replays: the change to PromptJobWorkflow is not "
        f"deterministic for jobs in flight; guard it with workflow.patched() "
        f"(docs/workflow-versioning.md). Cause: {result.replay_failure}"
    )


@pytest.mark.parametrize("path", RETENTION_HISTORIES, ids=[p.stem for p in RETENTION_HISTORIES])
async def test_retention_history_replays_on_the_current_workflow(path: Path) -> None:
    await replays(path, RetentionWorkflow)


def test_provider_batches_have_recorded_histories() -> None:
    assert {path.stem.split("-", 1)[1] for path in BATCH_HISTORIES} >= {"settled", "line_failed"}


@pytest.mark.parametrize("path", BATCH_HISTORIES, ids=[p.stem for p in BATCH_HISTORIES])
async def test_provider_batch_history_replays_on_the_current_workflow(path: Path) -> None:
    await replays(path, ProviderBatchWorkflow)


def test_webhook_deliveries_have_recorded_histories() -> None:
    recorded = {path.stem.split("-", 1)[1] for path in WEBHOOK_HISTORIES}
    assert recorded >= {"retried", "gone", "gave_up"}


@pytest.mark.parametrize("path", WEBHOOK_HISTORIES, ids=[p.stem for p in WEBHOOK_HISTORIES])
async def test_webhook_delivery_history_replays_on_the_current_workflow(path: Path) -> None:
    await replays(path, WebhookDeliveryWorkflow)


def test_failed_paths_of_the_current_workflow_end_failed() -> None:
    for path in HISTORIES:
        version, name = path.stem.split("-", 1)
        if name in FAILED_PATHS and version >= "v3":
            last = json.loads(path.read_text())["events"][-1]["eventType"]
            assert last == "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED", path.name


# -- the guard, demonstrated --------------------------------------------------------------


@workflow.defn(name="PromptJobWorkflow", sandboxed=False)
class UnguardedChange(PromptJobWorkflow):
    """Someone adds a pause before the adapter call, with no patch."""

    @workflow.run
    async def run(self, job: PromptJobInput) -> PromptJobResult:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(job)


@workflow.defn(name="PromptJobWorkflow", sandboxed=False)
class PatchedChange(PromptJobWorkflow):
    """The same change, taken only by workflows that start after it is deployed."""

    @workflow.run
    async def run(self, job: PromptJobInput) -> PromptJobResult:
        if workflow.patched("pause-before-adapter"):
            await workflow.sleep(timedelta(seconds=1))
        return await super().run(job)


async def test_an_unguarded_change_fails_replay() -> None:
    results = await Replayer(workflows=[UnguardedChange]).replay_workflows(
        all_histories(), raise_on_replay_failure=False
    )
    # Every recorded history fails (keyed by run id): each would break in flight.
    assert len(results.replay_failures) == len(HISTORIES)


async def test_the_same_change_behind_a_patch_replays() -> None:
    results = await Replayer(workflows=[PatchedChange]).replay_workflows(
        all_histories(), raise_on_replay_failure=False
    )
    assert results.replay_failures == {}


async def test_every_history_replays_on_a_deployments_worker() -> None:
    """The same histories on a worker that shares our workflow code between runs (the
    `shared` sandbox, a deployment's default; the tests above run the SDK's `strict` one):
    each activity's answer and each signal decodes there too."""
    runner = workflow_runner("shared")
    failures = []
    for paths, workflow_class in (
        (HISTORIES, PromptJobWorkflow),
        (RETENTION_HISTORIES, RetentionWorkflow),
        (BATCH_HISTORIES, ProviderBatchWorkflow),
        (WEBHOOK_HISTORIES, WebhookDeliveryWorkflow),
    ):
        replayer = Replayer(workflows=[workflow_class], workflow_runner=runner)
        for path in paths:
            result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
            if result.replay_failure is not None:
                failures.append(f"{path.name}: {result.replay_failure}")
    assert not failures, "\n".join(failures)
