"""How the worker's sandbox loads our workflow modules: shared by every run in a deployment
(the default), afresh for each run in the test suite (`strict`, every check on)."""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import WorkflowEnvironment
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from promptjobs.runtime import WORKFLOWS, workflow_runner
from promptjobs.settings import Settings
from tests.conftest import eventually, make_settings, running_stack


def test_a_deployment_shares_only_our_workflow_modules_and_the_tests_share_none() -> None:
    assert Settings().worker_workflow_sandbox == "shared"
    shared = workflow_runner("shared")
    assert isinstance(shared, SandboxedWorkflowRunner)
    ours = {workflow.__module__ for workflow in WORKFLOWS}
    assert ours == {
        "workflows.prompt_job",
        "workflows.provider_batch",
        "workflows.retention",
        "workflows.webhook_delivery",
    }
    # Every other restriction stays as the SDK sets it.
    default = SandboxRestrictions.default
    assert shared.restrictions.passthrough_modules == default.passthrough_modules | ours
    assert shared.restrictions.invalid_modules == default.invalid_modules
    assert shared.restrictions.invalid_module_members == default.invalid_module_members
    assert not shared.restrictions.passthrough_all_modules

    strict = workflow_runner("strict")
    assert isinstance(strict, SandboxedWorkflowRunner)
    assert strict.restrictions == default
    assert make_settings(Path("."), migrated=False).worker_workflow_sandbox == "strict"


async def test_a_worker_sharing_its_workflow_modules_takes_jobs_to_each_end(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, worker_workflow_sandbox="shared")
    async with running_stack(settings, dev_server.client) as stack:
        succeeds = await stack.submit("shared", options={"fake": {"latency_ms": 100}})
        fails = await stack.submit("broken", options={"fake": {"fail": ["provider_4xx"]}})
        cancelled = await stack.submit("long", options={"fake": {"latency_ms": 30_000}})
        await eventually(
            lambda: stack.job(cancelled["job_id"]), lambda job: job["state"] == "running"
        )
        # A signal into a running workflow: the shared class handles it as its own.
        answer = await stack.http.post(f"/v1/jobs/{cancelled['job_id']}/cancel")
        assert answer.status_code == 202, answer.text

        assert (await stack.settled(succeeds["job_id"]))["state"] == "succeeded"
        failed = await stack.settled(fails["job_id"])
        assert (failed["state"], failed["error_kind"]) == ("failed", "provider_4xx")
        assert (await stack.settled(cancelled["job_id"]))["state"] == "cancelled"
