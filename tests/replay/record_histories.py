"""Record the replay set: run every path of PromptJobWorkflow for real and save its history.

    .venv/bin/python -m tests.replay.record_histories        # rewrites tests/replay/histories/
    .venv/bin/python -m tests.replay.record_histories --version v5 chain_waits_then_runs ...
    .venv/bin/python -m tests.replay.record_histories retention   # RetentionWorkflow's run
    .venv/bin/python -m tests.replay.record_histories webhooks    # WebhookDeliveryWorkflow's

Run it after an intended, versioned workflow change (see docs/workflow-versioning.md), and
commit the new histories *beside* the old ones: the old ones keep guarding in-flight jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.contracts import ArchiveExpired
from projections.group_commit import WriteTx
from promptjobs.history import export_history
from promptjobs.launch import DEV_SERVER_ARGS
from promptjobs.mock_provider import run_mock_provider
from promptjobs.runtime import build_dispatcher, build_gatherer, temporal_cli
from tests.conftest import Stack, eventually, free_port, make_settings, new_worker, running_stack
from tests.integration.processes import process_env, promptjobs_process, temporal_address
from workflows import search_attributes
from workflows.retention import RetentionWorkflow

HISTORIES = Path(__file__).parent / "histories"
RETENTION_HISTORIES = HISTORIES / "retention"
WEBHOOK_HISTORIES = HISTORIES / "webhook_delivery"
VERSION = "v10"
# ProviderBatchWorkflow's runs, recorded with the deferrable scenarios.
PROVIDER_BATCH_HISTORIES = HISTORIES / "provider_batch"

Scenario = Callable[[Stack, WorkflowEnvironment], Awaitable[str]]


async def _run(stack: Stack, **body: object) -> str:
    job_id = str((await stack.submit("replay me", **body))["job_id"])
    async with new_worker(stack.settings, stack.client, stack.projection):
        await stack.settled(job_id, timeout=60)
    return job_id


async def success(stack: Stack, _env: WorkflowEnvironment) -> str:
    return await _run(stack)


async def retry_then_success(stack: Stack, _env: WorkflowEnvironment) -> str:
    return await _run(stack, options={"fake": {"fail": ["provider_5xx"]}})


async def exhausted(stack: Stack, _env: WorkflowEnvironment) -> str:
    return await _run(stack, max_attempts=2, options={"fake": {"fail": ["timeout", "timeout"]}})


async def non_retryable(stack: Stack, _env: WorkflowEnvironment) -> str:
    return await _run(stack, options={"fake": {"fail": ["auth"]}})


async def rate_limited(stack: Stack, _env: WorkflowEnvironment) -> str:
    return await _run(stack, options={"fake": {"fail": ["rate_limit"], "retry_after_s": 1}})


async def cancel_queued(stack: Stack, _env: WorkflowEnvironment) -> str:
    job_id = str((await stack.submit("replay me"))["job_id"])
    await eventually(lambda: _dispatched(stack, job_id), bool)
    assert (await stack.http.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
    async with new_worker(stack.settings, stack.client, stack.projection):
        await stack.settled(job_id)
    return job_id


async def cancel_running(stack: Stack, _env: WorkflowEnvironment) -> str:
    job_id = str(
        (await stack.submit("replay me", options={"fake": {"latency_ms": 3000}}))["job_id"]
    )
    async with new_worker(stack.settings, stack.client, stack.projection):
        await eventually(lambda: stack.job(job_id), lambda j: j["state"] == "running")
        assert (await stack.http.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
        await stack.settled(job_id)
    return job_id


async def crash_recovery(stack: Stack, env: WorkflowEnvironment) -> str:
    job_id = str(
        (await stack.submit("replay me", options={"fake": {"latency_ms": 3000}}))["job_id"]
    )
    settings = stack.settings.model_copy(update={"temporal_address": temporal_address(env)})
    with promptjobs_process("worker", process_env(settings), settings.data_dir / "procs") as first:
        await eventually(lambda: stack.job(job_id), lambda j: j["state"] == "running", timeout=30)
        first.kill()  # SIGKILL, mid-call
    async with new_worker(stack.settings, stack.client, stack.projection):
        await stack.settled(job_id, timeout=60)
    return job_id


async def stuck(stack: Stack, _env: WorkflowEnvironment) -> str:
    return await _run(stack, options={"fake": {"fail": ["stuck"]}})


async def scheduled(stack: Stack, _env: WorkflowEnvironment) -> str:
    at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    return await _run(stack, scheduled_for=at)


async def _chain(stack: Stack, parent_options: dict[str, object]) -> tuple[str, str]:
    """A parent and a child waiting on it: their job ids."""
    parent = await stack.submit("replay parent", options=parent_options)
    child = await stack.submit("child of {{after[0]}}", after=[parent["prompt_id"]])
    return str(parent["job_id"]), str(child["job_id"])


async def chain_waits_then_runs(stack: Stack, _env: WorkflowEnvironment) -> str:
    _parent, child = await _chain(stack, {"fake": {"latency_ms": 1500}})
    async with new_worker(stack.settings, stack.client, stack.projection):
        await stack.settled(child, timeout=60)
    return child


async def chain_parent_retried(stack: Stack, _env: WorkflowEnvironment) -> str:
    parent, child = await _chain(stack, {"fake": {"fail": ["auth"]}})
    async with new_worker(stack.settings, stack.client, stack.projection):
        await stack.settled(parent)
        retry = await stack.http.post(f"/v1/jobs/{parent}/retry", json={"options": {}})
        assert retry.status_code == 202, retry.text
        await stack.settled(child, timeout=60)
    return child


async def chain_cancel_waiting(stack: Stack, _env: WorkflowEnvironment) -> str:
    parent, child = await _chain(stack, {"fake": {"fail": ["auth"]}})
    async with new_worker(stack.settings, stack.client, stack.projection):
        await stack.settled(parent)
        assert (await stack.http.post(f"/v1/jobs/{child}/cancel")).status_code == 202
        await stack.settled(child)
    return child


async def chain_stuck_waiting(stack: Stack, _env: WorkflowEnvironment) -> str:
    _parent, child = await _chain(stack, {"fake": {"fail": ["auth"]}})
    async with new_worker(stack.settings, stack.client, stack.projection):
        await stack.settled(child, timeout=60)
    return child


async def restarted(stack: Stack, _env: WorkflowEnvironment) -> str:
    """A job whose first workflow was lost after one failed attempt, started again (as the
    reconciler does): the new workflow continues the attempt count."""
    from projections.domain.lifecycle import ErrorKind, JobState
    from projections.projector import Transition
    from projections.scope import Scope
    from projections.writes import Submission

    store = stack.projection.store
    accepted = await store.submit(
        Scope("acme", "alice"),
        Submission(text="replay me", priority=50, max_attempts=3, options={}),
    )
    job_id = accepted.job.job_id
    await store.mark_dispatched(job_id)  # before the dispatcher's scan can start it
    await stack.projection.projector.start_attempt(job_id, 1, "lost-worker")
    requeue = Transition(
        job_id, JobState.QUEUED, 1, error_kind=ErrorKind.PROVIDER_5XX, error_message="lost"
    )
    await stack.projection.projector.apply(requeue)
    dispatcher = build_dispatcher(stack.settings, stack.client, stack.projection)
    await dispatcher.start(await store.job(Scope.operator(), job_id))
    async with new_worker(stack.settings, stack.client, stack.projection):
        settled = await stack.settled(job_id, timeout=60)
    assert (settled["state"], settled["attempt"]) == ("succeeded", 2), settled
    return job_id


async def closed_failed(stack: Stack, _env: WorkflowEnvironment) -> str:
    """The row was failed (`stuck`, by the reconciler) before the workflow's attempt ran."""
    from projections.domain.lifecycle import ErrorKind, JobState
    from projections.projector import Transition

    at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    job_id = str((await stack.submit("replay me", scheduled_for=at))["job_id"])
    await eventually(lambda: _dispatched(stack, job_id), bool)
    stuck = Transition(job_id, JobState.FAILED, error_kind=ErrorKind.STUCK, error_message="ceiling")
    assert (await stack.projection.projector.apply(stuck)).applied
    async with new_worker(stack.settings, stack.client, stack.projection):
        with contextlib.suppress(WorkflowFailureError):
            await stack.client.get_workflow_handle(job_id).result()
    return job_id


async def org_slot_wait(stack: Stack, _env: WorkflowEnvironment) -> str:
    """Its org's one running slot is taken (recorded with PROMPTJOBS_ORG_MAX_RUNNING=1): the
    job is refused once (org_busy), woken by the dispatcher when the slot frees, then runs."""
    async with new_worker(stack.settings, stack.client, stack.projection):
        holder = await stack.submit("holds the slot", options={"fake": {"latency_ms": 3000}})
        await eventually(lambda: stack.job(holder["job_id"]), lambda job: job["state"] == "running")
        job_id = str((await stack.submit("waits for it"))["job_id"])
        await stack.settled(job_id, timeout=60)
    return job_id


async def budget_wait(stack: Stack, _env: WorkflowEnvironment) -> str:
    """Its provider budget takes one request a window (shortened to 2 s for it, below): the
    second job is refused (provider_busy), waits for its room, then runs."""
    await stack.projection.store.budgets.set_limits("fake/fake-1", 1, None, datetime.now(UTC))
    async with new_worker(stack.settings, stack.client, stack.projection):
        first = await stack.submit("takes the room")
        await stack.settled(first["job_id"], timeout=60)
        job_id = str((await stack.submit("waits for it"))["job_id"])
        await stack.settled(job_id, timeout=60)
    return job_id


async def _deferred(stack: Stack, prompt: str, **options: object) -> str:
    """A deferrable job, run by a worker with its gatherer (services/batching.py)."""
    body = {"deferrable": True, **options}
    job_id = str((await stack.submit(prompt, options=body))["job_id"])
    gatherer = build_gatherer(stack.settings, stack.client, stack.projection)
    stop = asyncio.Event()
    gathering = asyncio.create_task(gatherer.run(stop=stop))
    try:
        async with new_worker(stack.settings, stack.client, stack.projection):
            await stack.settled(job_id, timeout=60)
            batch_id = await _batch_of(stack, job_id)
            if batch_id is not None:
                await stack.client.get_workflow_handle(batch_id).result()
    finally:
        stop.set()
        await gathering
    return job_id


async def _batch_of(stack: Stack, job_id: str) -> str | None:
    from projections.models import DeferredJob

    async with stack.projection.sessions() as session:
        deferred = await session.get(DeferredJob, job_id)
        return None if deferred is None else deferred.batch_id


async def _keep_batch(stack: Stack, job_id: str, name: str) -> None:
    batch_id = await _batch_of(stack, job_id)
    assert batch_id is not None, job_id
    path = PROVIDER_BATCH_HISTORIES / f"v1-{name}.json"
    path.write_text(await export_history(stack.client, batch_id))
    print(f"{'provider batch':20} {name:10} → {path.relative_to(Path.cwd())}")


async def deferred_direct(stack: Stack, _env: WorkflowEnvironment) -> str:
    """A deferrable job of a provider without a batch API (the fake) runs directly."""
    return await _deferred(stack, "replay me", provider="fake")


async def deferred_batch(stack: Stack, _env: WorkflowEnvironment) -> str:
    """A deferrable job runs in a provider batch (the mock's OpenAI Batch API)."""
    job_id = await _deferred(stack, "replay me", provider="openai")
    await _keep_batch(stack, job_id, "settled")
    return job_id


async def deferred_line_failed(stack: Stack, _env: WorkflowEnvironment) -> str:
    """Its line in the provider batch is a 429: the job runs directly, at no attempt."""
    job_id = await _deferred(stack, "replay me mock:fail=429", provider="openai")
    await _keep_batch(stack, job_id, "line_failed")
    return job_id


async def _dispatched(stack: Stack, job_id: str) -> bool:
    async with stack.projection.sessions() as session:
        from projections.models import Job

        job = await session.get(Job, job_id)
        return job is not None and job.dispatched_at is not None


SCENARIOS: dict[str, Scenario] = {
    "success": success,
    "retry_then_success": retry_then_success,
    "exhausted": exhausted,
    "non_retryable": non_retryable,
    "rate_limited": rate_limited,
    "cancel_queued": cancel_queued,
    "cancel_running": cancel_running,
    "crash_recovery": crash_recovery,
    "stuck": stuck,
    "scheduled": scheduled,
    # Chains (patch wait-for-parents), recorded as v5.
    "chain_waits_then_runs": chain_waits_then_runs,
    "chain_parent_retried": chain_parent_retried,
    "chain_cancel_waiting": chain_cancel_waiting,
    "chain_stuck_waiting": chain_stuck_waiting,
    "restarted": restarted,
    "closed_failed": closed_failed,
    # Each org's running limit (patch org-running-limit), recorded as v6 with the rest.
    "org_slot_wait": org_slot_wait,
    # Provider budgets (patch provider-budgets), recorded as v8 with the rest; `rate_limited`
    # takes the budget's pause there.
    "budget_wait": budget_wait,
    # Deferrable jobs (patch provider-batches), recorded as v9 with the rest, with the
    # provider batches' own runs (ProviderBatchWorkflow) beside them.
    "deferred_direct": deferred_direct,
    "deferred_batch": deferred_batch,
    "deferred_line_failed": deferred_line_failed,
}


async def record_retention(env: WorkflowEnvironment) -> None:
    """One run of the retention schedule's workflow (RetentionWorkflow), removing one job."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = make_settings(Path(tmp))
        async with running_stack(settings, env.client, run_worker=False) as stack:
            await _run(stack)
            workflow_id = f"retention-{uuid.uuid4().hex[:8]}"
            async with new_worker(stack.settings, stack.client, stack.projection):
                report = await env.client.execute_workflow(
                    RetentionWorkflow.run,
                    ArchiveExpired(retention_days=0.0),
                    id=workflow_id,
                    task_queue=settings.temporal_task_queue,
                )
            path = RETENTION_HISTORIES / "v1-archive.json"
            path.write_text(await export_history(env.client, workflow_id))
            print(f"retention            removed {report.jobs} → {path.relative_to(Path.cwd())}")


async def record_webhooks(env: WorkflowEnvironment) -> None:
    """WebhookDeliveryWorkflow's runs: a receiver that refuses the first tries and then takes
    the event (`retried`), and one that answers 410 Gone (`gone`)."""
    WEBHOOK_HISTORIES.mkdir(exist_ok=True)
    for name, answer in (("retried", 500), ("gone", 410)):
        await _record_webhook(env, name, answer)
    await _record_webhook_gave_up()


async def _record_webhook_gave_up() -> None:
    """A receiver that never answers, for the whole schedule (three days, skipped through on
    the time-skipping test server): the tries end and `webhook_gave_up` runs."""
    from shutil import which

    from temporalio.worker import Worker

    from activities.webhooks import Allowed, WebhookActivities
    from projections.event_log import utcnow
    from projections.webhooks import JOB_WEBHOOKS, enqueue
    from promptjobs.wiring import open_projection
    from workflows.contracts import WebhookDeliveryInput
    from workflows.webhook_delivery import WebhookDeliveryWorkflow

    server = which("temporal-test-server") or str(
        Path(temporal_cli()).parent / "temporal-test-server"
    )
    env = await WorkflowEnvironment.start_time_skipping(test_server_existing_path=server)
    closed = f"http://127.0.0.1:{free_port()}/hooks"  # nothing listens there
    try:
        with tempfile.TemporaryDirectory() as tmp:
            settings = make_settings(Path(tmp))
            async with open_projection(settings) as projection:
                store = projection.store

                def write(tx: WriteTx) -> None:
                    enqueue(tx, "acme", "job.succeeded", {"id": "job_1"}, utcnow(), "job_1",
                            [JOB_WEBHOOKS], closed)  # fmt: skip

                await store.webhooks.writes.run(write)
                [delivery] = await store.webhooks.deliveries("acme", JOB_WEBHOOKS)
                sender = WebhookActivities(store, Allowed.of([], ["127.0.0.0/8"]), timeout_s=1.0)
                async with Worker(
                    env.client,
                    task_queue="webhooks-replay",
                    workflows=[WebhookDeliveryWorkflow],
                    activities=[sender.deliver_webhook, sender.webhook_gave_up],
                ):
                    outcome = await env.client.execute_workflow(
                        WebhookDeliveryWorkflow.run,
                        WebhookDeliveryInput(delivery.delivery_id, timeout_s=1.0),
                        id=delivery.delivery_id,
                        task_queue="webhooks-replay",
                    )
                path = WEBHOOK_HISTORIES / "v1-gave_up.json"
                path.write_text(await export_history(env.client, delivery.delivery_id))
                print(f"webhook gave_up      {outcome:10} → {path.relative_to(Path.cwd())}")
    finally:
        await env.shutdown()


async def _record_webhook(env: WorkflowEnvironment, name: str, answer: int) -> None:
    from tests.integration.test_webhooks import Receiver

    receiver = Receiver(answer=answer)
    await receiver.start()

    async def got() -> list[dict[str, object]]:
        return receiver.got

    try:
        with tempfile.TemporaryDirectory() as tmp:
            settings = make_settings(
                Path(tmp), webhook_allow_ranges=["127.0.0.0/8"], webhook_first_retry_s=0.5
            )
            async with running_stack(settings, env.client) as stack:
                await stack.submit("replay me", webhook=receiver.url)
                first = (await eventually(got, len))[0]
                if name == "retried":
                    await eventually(got, lambda tries: len(tries) > 1)
                    receiver.answer = 200
                headers = first["headers"]
                assert isinstance(headers, dict)
                delivery_id = str(headers["webhook-id"])
                handle = env.client.get_workflow_handle(delivery_id)
                outcome = await asyncio.wait_for(handle.result(), 60)
                path = WEBHOOK_HISTORIES / f"v1-{name}.json"
                path.write_text(await export_history(env.client, delivery_id))
                print(f"webhook {name:12} {outcome:10} → {path.relative_to(Path.cwd())}")
    finally:
        await receiver.stop()


async def record(names: list[str], version: str = VERSION) -> None:
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        search_attributes=search_attributes.ALL,
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=DEV_SERVER_ARGS,
        dev_server_log_level="error",
    )
    mock_stop, mock_ready = asyncio.Event(), asyncio.Event()
    mock_port = free_port()
    mock = asyncio.create_task(
        run_mock_provider("127.0.0.1", mock_port, stop=mock_stop, on_ready=mock_ready.set)
    )
    await mock_ready.wait()
    PROVIDER_BATCH_HISTORIES.mkdir(exist_ok=True)
    try:
        if "retention" in names:
            names = [name for name in names if name != "retention"]
            await record_retention(env)
        if "webhooks" in names:
            names = [name for name in names if name != "webhooks"]
            await record_webhooks(env)
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                settings = make_settings(
                    Path(tmp),
                    heartbeat_timeout_s=2.0,
                    backoff_initial_s=1.0,
                    rate_limit_default_s=1.0,
                    job_ceiling_s=3.0 if name in ("stuck", "chain_stuck_waiting") else 900.0,
                    org_max_running=1 if name == "org_slot_wait" else 100,
                    default_provider="fake",
                    openai_base_url=f"http://127.0.0.1:{mock_port}/v1",
                    openai_api_key="mock-key",
                    batch_max_wait_s=0.5,
                    batch_poll_s=0.3,
                    budget_window_s=2.0 if name == "budget_wait" else 60.0,
                )
                async with running_stack(settings, env.client, run_worker=False) as stack:
                    job_id = await SCENARIOS[name](stack, env)
                    # The row settles a moment before the workflow closes (a worker must
                    # still take its last workflow task); record it closed.
                    async with new_worker(stack.settings, stack.client, stack.projection):
                        with contextlib.suppress(WorkflowFailureError):
                            await env.client.get_workflow_handle(job_id).result()
                    state = (await stack.job(job_id))["state"]
                    path = HISTORIES / f"{version}-{name}.json"
                    path.write_text(await export_history(env.client, job_id))
                    print(f"{name:20} {state:10} → {path.relative_to(Path.cwd())}")
    finally:
        mock_stop.set()
        await mock
        await env.shutdown()


if __name__ == "__main__":
    args = sys.argv[1:]
    version = VERSION
    if args[:1] == ["--version"]:
        version, args = args[1], args[2:]
    asyncio.run(record(args or list(SCENARIOS), version))
