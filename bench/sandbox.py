"""What Temporal's sandbox costs a worker for each workflow run it starts: the instance the
worker builds for a run, with our workflow modules shared (a deployment's worker) and
imported afresh (`strict`, the tests' and the SDK's way), beside bench/bare.py's workflow
with the SDK's defaults. The CPU of one instance, best of five rounds. [COUNT]"""

from __future__ import annotations

import asyncio
import time

from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.workflow import _Definition

from bench.bare import BareWorkflow
from bench.harness import Report, args, ms
from promptjobs.runtime import workflow_runner
from workflows.prompt_job import PromptJobWorkflow
from workflows.webhook_delivery import WebhookDeliveryWorkflow

ARGS = args(default_count=200)
ROUNDS = 5


def per_instance(runner: WorkflowRunner, workflow: type) -> float:
    """CPU seconds of one instance: `prepare_workflow` builds one as a run's first
    activation does (the module's import, `workflow.defn`, the instance), with fake info."""
    defn = _Definition.must_from_class(workflow)
    runner.prepare_workflow(defn)
    best = float("inf")
    for _ in range(ROUNDS):
        began = time.process_time()
        for _ in range(ARGS.count):
            runner.prepare_workflow(defn)
        best = min(best, (time.process_time() - began) / ARGS.count)
    return best


async def main() -> Report:
    # The instance binds itself to the running event loop, as in a worker.
    report = Report(
        "the sandbox's cost per workflow run",
        {"instances": f"{ARGS.count} a round, best of {ROUNDS}, CPU of this process"},
    )
    report.start()
    report.add(
        "bare workflow, SDK defaults", ms(per_instance(SandboxedWorkflowRunner(), BareWorkflow))
    )
    for sandbox in ("strict", "shared"):
        runner = workflow_runner(sandbox)
        for workflow in (PromptJobWorkflow, WebhookDeliveryWorkflow):
            report.add(f"{workflow.__name__}, {sandbox}", ms(per_instance(runner, workflow)))
    return report


if __name__ == "__main__":
    asyncio.run(main()).print()
