"""How the worker's sandbox loads our workflow modules: shared by every run in a deployment
(the default), afresh for each run in the test suite (`strict`, every check on)."""

from __future__ import annotations

import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from promptjobs.runtime import WORKFLOWS, workflow_runner
from promptjobs.settings import Settings
from tests.conftest import eventually, make_settings, running_stack
from tests.integration.processes import process_env, promptjobs_process, temporal_address


def test_a_deployment_shares_our_packages_and_the_tests_share_nothing_more() -> None:
    assert Settings().worker_workflow_sandbox == "shared"
    shared = workflow_runner("shared")
    assert isinstance(shared, SandboxedWorkflowRunner)
    assert {workflow.__module__ for workflow in WORKFLOWS} == {
        "workflows.prompt_job",
        "workflows.provider_batch",
        "workflows.retention",
        "workflows.webhook_delivery",
    }
    # Our packages join the modules passed through; every other restriction stays the SDK's.
    default = SandboxRestrictions.default
    assert shared.restrictions.passthrough_modules == default.passthrough_modules | {
        "workflows",
        "activities",
        "projections",
    }
    assert shared.restrictions.invalid_modules == default.invalid_modules
    assert shared.restrictions.invalid_module_members == default.invalid_module_members
    assert not shared.restrictions.passthrough_all_modules

    strict = workflow_runner("strict")
    assert isinstance(strict, SandboxedWorkflowRunner)
    assert strict.restrictions == default
    assert make_settings(Path("."), migrated=False).worker_workflow_sandbox == "strict"


def test_our_workflow_modules_hold_no_state_one_run_could_leave_to_the_next() -> None:
    """What sharing them rests on: nothing mutable at module or class level."""
    mutable = (list, dict, set, bytearray)
    for workflow in WORKFLOWS:
        module = sys.modules[workflow.__module__]
        for owner in (module, workflow):
            held = [
                name
                for name, value in vars(owner).items()
                if not name.startswith("__") and isinstance(value, mutable)
            ]
            assert not held, f"{owner.__name__} holds mutable state: {held}"


async def test_a_worker_process_sharing_its_workflow_modules_takes_jobs_to_each_end(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`promptjobs worker` as deployed, its sandbox `shared` by default: a workflow decodes
    each activity's answer (a dataclass whose annotations live in modules no run imports)."""
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'shared.db'}",
        temporal_address=temporal_address(dev_server),
    )
    env = process_env(settings)
    assert "PROMPTJOBS_WORKER_WORKFLOW_SANDBOX" not in env
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", env, tmp_path / "procs") as worker:
            await worker.ready()
            succeeds = await stack.submit("shared", options={"fake": {"latency_ms": 100}})
            fails = await stack.submit("broken", options={"fake": {"fail": ["provider_4xx"]}})
            flaky = await stack.submit(
                "flaky", options={"fake": {"fail": ["provider_5xx"], "latency_ms": 100}}
            )
            cancelled = await stack.submit("long", options={"fake": {"latency_ms": 30_000}})
            await eventually(
                lambda: stack.job(cancelled["job_id"]),
                lambda job: job["state"] == "running",
                timeout=30,
            )
            # A signal into a running workflow: the shared class handles it as its own.
            answer = await stack.http.post(f"/v1/jobs/{cancelled['job_id']}/cancel")
            assert answer.status_code == 202, answer.text

            assert (await stack.settled(succeeds["job_id"], 30))["state"] == "succeeded"
            failed = await stack.settled(fails["job_id"], 30)
            assert (failed["state"], failed["error_kind"]) == ("failed", "provider_4xx")
            retried = await stack.settled(flaky["job_id"], 30)
            assert (retried["state"], retried["attempt"]) == ("succeeded", 2)
            assert (await stack.settled(cancelled["job_id"], 30))["state"] == "cancelled"
            assert "Traceback" not in worker.output(), worker.output()
