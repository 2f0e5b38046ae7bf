"""A worker's observability: its Prometheus endpoint (our counters and the Temporal SDK's
worker metrics on one port) and its record in the projection's worker registry."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from activities.job_activities import worker_identity
from api.routes.metrics import bearer_token, token_matches
from projections import workers
from projections.workers import WorkerRegistry
from promptjobs.settings import Settings

log = logging.getLogger("promptjobs")

# The Temporal SDK's worker metrics the dashboard (deploy/grafana) and docs/operators.md rely
# on; test_worker_observability.py checks a real worker's port serves each of them.
SDK_WORKER_METRICS = (
    "temporal_worker_task_slots_available",
    "temporal_worker_task_slots_used",
    "temporal_activity_schedule_to_start_latency",
    "temporal_workflow_task_schedule_to_start_latency",
    "temporal_num_pollers",
)


# Temporal core's own log lines (WARN and up), forwarded to this logger instead of printed.
CORE_LOGGER = "temporalio.core"
# What core says when an activity it no longer tracks completes: every cancelled job's call
# does (the workflow cancelled it; the call then ends), so it is expected, not a warning.
EXPECTED_CORE_WARNINGS = ("Activity not found on completion",)


class ExpectedCoreWarnings(logging.Filter):
    """Lowers Temporal core's expected warnings to DEBUG, where they stay available."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and any(
            text in record.getMessage() for text in EXPECTED_CORE_WARNINGS
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def core_logging() -> LoggingConfig:
    """Core's warnings through Python's logging (one format, one place to filter)."""
    logger = logging.getLogger(CORE_LOGGER)
    if not any(isinstance(f, ExpectedCoreWarnings) for f in logger.filters):
        logger.addFilter(ExpectedCoreWarnings())
    return LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logger, append_target_to_name=False),
    )


def install_core_logging() -> None:
    """Make the process's default Temporal runtime forward core's logs (call before any
    client or test server is made: the default runtime is built once)."""
    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=core_logging())))


def free_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WorkerMetrics:
    """The SDK's Prometheus exporter is an HTTP server of its own, inside its native runtime.
    It listens on a loopback port only; the worker's one public metrics port serves our
    counters followed by what that exporter says, so a scrape target is one port per worker
    and scaling workers needs no second scrape job."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sdk_address = f"127.0.0.1:{free_local_port()}"
        self.runtime = Runtime(
            telemetry=TelemetryConfig(
                logging=core_logging(),
                metrics=PrometheusConfig(bind_address=self.sdk_address, durations_as_seconds=True),
            )
        )
        token = settings.metrics_token
        self._token = token.get_secret_value() if token else None

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/metrics", self.scrape)])

    async def scrape(self, request: Request) -> Response:
        if not token_matches(self._token, bearer_token(request.headers.get("authorization"))):
            return Response(
                "send Authorization: Bearer <PROMPTJOBS_METRICS_TOKEN>\n",
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        ours = generate_latest()
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                sdk = (await http.get(f"http://{self.sdk_address}/metrics")).content
        except httpx.HTTPError as err:
            # Our counters are still worth a scrape; say why the SDK's are missing.
            sdk = f"# Temporal SDK metrics unavailable: {err}\n".encode()
        return Response(ours + sdk, media_type=CONTENT_TYPE_LATEST)

    async def serve(self, stop: asyncio.Event) -> None:
        from promptjobs.runtime import api_server

        port = self.settings.worker_metrics_port
        assert port is not None
        server = api_server(self.app(), self.settings.worker_metrics_host, port, grace_s=1)
        task = asyncio.create_task(server.serve())
        log.warning(
            "worker metrics on http://%s:%s/metrics", self.settings.worker_metrics_host, port
        )
        await stop.wait()
        server.should_exit = True
        await task


def worker_config(settings: Settings) -> dict[str, Any]:
    """What `promptjobs status` shows a worker runs with: what differs between workers and
    explains their behaviour, never a credential."""
    return {
        "pid": os.getpid(),
        "task_queue": settings.temporal_task_queue,
        "namespace": settings.temporal_namespace,
        "temporal_address": settings.temporal_address,
        "max_concurrent_activities": settings.worker_max_concurrent_activities,
        "max_concurrent_workflow_tasks": settings.worker_max_concurrent_workflow_tasks,
        "workflow_sandbox": settings.worker_workflow_sandbox,
        "heartbeat_timeout_s": settings.heartbeat_timeout_s,
        "shutdown_grace_s": settings.shutdown_grace_s,
        "default_provider": settings.provider_default,
        "providers_configured": [
            name
            for name, on in (
                ("fake", settings.fake_adapter),
                ("openai", settings.openai_api_key is not None),
                ("anthropic", settings.anthropic_api_key is not None),
            )
            if on
        ],
        "metrics_port": settings.worker_metrics_port,
        "tracing": settings.tracing_exporter or "off",
    }


async def keep_registered(
    settings: Settings,
    registry: WorkerRegistry,
    stop: asyncio.Event,
    *,
    identity: str | None = None,
    now: Callable[[], datetime] = workers.utcnow,
) -> None:
    """Beat every `worker_heartbeat_s` until `stop`, then record the shutdown. A failed write
    (the database away) is logged and tried again at the next beat: it is no reason to stop
    a worker."""
    identity = identity or worker_identity()
    config = worker_config(settings)
    started = now()
    while True:
        stopping = stop.is_set()
        try:
            await registry.heartbeat(identity, config, started, stopped=stopping)
        except (SQLAlchemyError, OSError) as err:
            log.warning("cannot record worker heartbeat: %s", err)
        if stopping:
            return
        try:
            await asyncio.wait_for(stop.wait(), settings.worker_heartbeat_s)
        except TimeoutError:
            pass
