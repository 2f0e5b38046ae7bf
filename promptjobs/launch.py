"""Process launchers: `dev` (everything embedded), `api` and `worker` as separate processes."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from temporalio.client import Client, Interceptor
from temporalio.runtime import Runtime
from temporalio.testing import WorkflowEnvironment

from projections.keys import IssuedKey
from promptjobs.observability import WorkerMetrics, free_local_port, keep_registered
from promptjobs.runtime import (
    Projection,
    api_server,
    build_adapters,
    build_app,
    build_dispatcher,
    build_gatherer,
    build_worker,
    connect_temporal,
    open_projection,
    temporal_cli,
    webhook_sender,
)
from promptjobs.settings import Settings
from promptjobs.tracing import Tracing, start_tracing
from services.dispatch import PRIORITY_LEVELS
from services.retention import RetentionPolicy, keep_retention_schedule
from services.webhooks import WebhookStarter
from workflows import search_attributes

log = logging.getLogger("promptjobs")


class LaunchError(Exception):
    """A launcher cannot start; the message says what to change."""


def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def ensure_port_free(host: str, port: int, what: str, setting: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise LaunchError(
                f"{what} port {host}:{port} is in use ({err.strerror}); "
                f"stop what holds it or set {setting}"
            ) from err


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


DEV_SERVER_ARGS = [
    # On-disk, yet near in-memory speed (measured: bench/README.md).
    "--sqlite-pragma", "journal_mode=wal",
    "--sqlite-pragma", "synchronous=normal",
    # One partition, so task-queue priority is strict; fairness keys balance orgs.
    "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
    "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
    "--dynamic-config-value", "matching.enableFairness=true",
    # One priority key per priority 0…100 (services/dispatch.py temporal_priority).
    "--dynamic-config-value", f"matching.priorityLevels={PRIORITY_LEVELS}",
]  # fmt: skip


async def start_dev_temporal(
    settings: Settings, *, ui: bool = True, interceptors: Sequence[Interceptor] = ()
) -> WorkflowEnvironment:
    host, port = split_address(settings.temporal_address)
    ensure_port_free(host, port, "Temporal", "PROMPTJOBS_TEMPORAL_ADDRESS")
    if ui:
        ensure_port_free(
            host, settings.temporal_ui_port, "Temporal Web UI", "PROMPTJOBS_TEMPORAL_UI_PORT"
        )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    others = set(dev_server_pids())
    with _env_without_otel():
        env = await WorkflowEnvironment.start_local(
            interceptors=interceptors,
            ip=host,
            port=port,
            namespace=settings.temporal_namespace,
            ui=ui,
            ui_port=settings.temporal_ui_port if ui else None,
            search_attributes=search_attributes.ALL,
            dev_server_existing_path=temporal_cli(),
            dev_server_database_filename=str((settings.data_dir / "temporal.db").resolve()),
            dev_server_extra_args=DEV_SERVER_ARGS,
            dev_server_log_level="error",
        )
    for pid in set(dev_server_pids()) - others:
        lower_priority(pid, settings.temporal_dev_nice)
    return env


def dev_server_pids() -> list[int]:
    """This process's children that are a Temporal dev server (Linux; none elsewhere)."""
    found = []
    for task in Path("/proc/self/task").glob("*/children"):
        with suppress(OSError):
            for child in task.read_text().split():
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                if Path(argv[0].decode(errors="replace")).name == "temporal" and (
                    b"start-dev" in argv
                ):
                    found.append(int(child))
    return found


def lower_priority(pid: int, nice: int) -> None:
    """Every thread of process `pid` at niceness `nice` at least. Linux keeps a niceness per
    thread, and a thread made later inherits its maker's, so the whole process follows."""
    if nice <= 0:
        return
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with suppress(OSError):
            tid = int(task.name)
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)


@contextmanager
def _env_without_otel() -> Iterator[None]:
    """The embedded Temporal server inherits our environment, and reads the same OTEL_*
    variables with other values allowed (`OTEL_TRACES_EXPORTER=console` makes it exit): it
    starts without them. Our own tracing has read them already."""
    ours = {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}
    for name in ours:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(ours)


def retention_policy(settings: Settings) -> RetentionPolicy:
    return RetentionPolicy(
        task_queue=settings.temporal_task_queue,
        days=settings.retention_days,
        batch=settings.retention_batch,
        interval_s=settings.retention_interval_s,
    )


async def dev_api_key(projection: Projection, data_dir: Path) -> str:
    """The embedded stack's own key (org `dev`, admin), kept so a restart prints the same one."""
    path = data_dir / "dev-api-key"
    if path.exists():
        return path.read_text().strip()
    issued: IssuedKey = await projection.store.keys.create("dev", "dev", "admin")
    path.write_text(issued.secret + "\n")
    path.chmod(0o600)
    return issued.secret


@dataclass
class DevStack:
    api_url: str
    ui_url: str | None
    temporal_address: str
    api_key: str
    database_url: str
    env_file: Path
    worker_metrics_url: str


def write_env_file(settings: Settings, api_key: str) -> Path:
    """`<data dir>/env`: the variables a second shell needs to reach this stack with the CLI
    and the Python client (`source` it); rewritten at each start, readable by its owner."""
    values = {
        "PROMPTJOBS_TEMPORAL_ADDRESS": settings.temporal_address,
        "PROMPTJOBS_TEMPORAL_NAMESPACE": settings.temporal_namespace,
        "PROMPTJOBS_TEMPORAL_TASK_QUEUE": settings.temporal_task_queue,
        "PROMPTJOBS_URL": f"http://{settings.api_host}:{settings.api_port}",
        "PROMPTJOBS_API_KEY": api_key,
    }
    if settings.database_url:
        values["PROMPTJOBS_DATABASE_URL"] = settings.database_url
    else:
        values["PROMPTJOBS_DATA_DIR"] = str(settings.data_dir.resolve())
    path = settings.data_dir / "env"
    lines = ["# promptjobs dev: what another shell needs to reach it. Source this file."]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


async def run_dev(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ui: bool = True,
    on_ready: Callable[[DevStack], None] | None = None,
) -> None:
    """Temporal dev server, dispatcher and API in this process and a worker in a child
    process, until `stop`."""
    stop = stop or asyncio.Event()
    ensure_port_free(settings.api_host, settings.api_port, "API", "PROMPTJOBS_API_PORT")
    tracing = start_tracing(settings, "dev")
    env = await start_dev_temporal(
        settings, ui=ui, interceptors=tracing.interceptors() if tracing else ()
    )
    # The worker's own metrics (its transitions, adapter calls, tokens), on a port of its own.
    worker_settings = settings
    if settings.worker_metrics_port is None:
        worker_settings = settings.model_copy(update={"worker_metrics_port": free_local_port()})
    try:
        async with open_projection(settings, listen=True) as projection:
            key = await dev_api_key(projection, settings.data_dir)
            stack = DevStack(
                api_url=f"http://{settings.api_host}:{settings.api_port}",
                ui_url=f"http://{split_address(settings.temporal_address)[0]}:{settings.temporal_ui_port}"
                if ui
                else None,
                temporal_address=settings.temporal_address,
                api_key=key,
                database_url=make_url(settings.projection_url).render_as_string(hide_password=True),
                env_file=write_env_file(settings, key),
                worker_metrics_url=(
                    f"http://{worker_settings.worker_metrics_host}:"
                    f"{worker_settings.worker_metrics_port}/metrics"
                ),
            )
            # The worker in a process of its own, as in production: its adapters' streaming
            # and projection writes do not share the API's event loop and interpreter.
            async with worker_process(worker_settings, stop) as worker:
                await serve(
                    settings,
                    env.client,
                    projection,
                    stop,
                    run_worker=False,
                    run_api=True,
                    on_ready=lambda: on_ready(stack) if on_ready else None,
                    tracing=tracing,
                    watch=[worker],
                )
    finally:
        await env.shutdown()
        if tracing is not None:
            tracing.shutdown()


@asynccontextmanager
async def worker_process(
    settings: Settings, stop: asyncio.Event
) -> AsyncIterator[asyncio.Task[int]]:
    """`promptjobs worker` as a child process with `settings`, its output on ours; yields a
    task that ends (with its exit code) if the worker does. Stopped on the way out: SIGTERM,
    the shutdown grace, then SIGKILL. A child of a parent that dies is sent SIGTERM too
    (Linux), so Ctrl-C or a kill of `promptjobs dev` leaves no worker behind."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTJOBS_")}
    env.pop("DATABASE_URL", None)
    env.update(settings.environment())
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "promptjobs", "worker", env=env, preexec_fn=_die_with_parent
    )
    exited = asyncio.create_task(child.wait(), name="worker process")
    try:
        yield exited
    finally:
        stop.set()
        if child.returncode is None:
            with suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(settings.shutdown_grace_s + 15):
                    await asyncio.shield(exited)
            except TimeoutError:
                child.kill()
                await exited


# prctl(2), looked up here: the child calls it between fork and exec, where loading a
# library could wait for a lock another thread of ours held at the fork.
_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the parent dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


async def serve(
    settings: Settings,
    client: Client,
    projection: Projection,
    stop: asyncio.Event,
    *,
    run_worker: bool,
    run_api: bool,
    on_ready: Callable[[], None] | None = None,
    tracing: Tracing | None = None,
    watch: Sequence[asyncio.Task[Any]] = (),
) -> None:
    """Run a worker and/or the API (with its dispatcher) against one projection until `stop`
    (or until a task of `watch`, a part that runs elsewhere, ends).

    On stop the API closes its listening socket, ends its SSE streams (their clients resume
    with Last-Event-ID elsewhere) and lets in-flight requests finish within
    `shutdown_grace_s`; the worker stops polling and gives in-flight activities the same
    grace. An adapter call cut off by the grace period is recorded as a worker_crash and
    retried by Temporal on another worker; nothing is lost."""
    adapters = build_adapters(settings)
    tasks: list[asyncio.Task[None]] = []
    worker = build_worker(settings, client, projection, adapters) if run_worker else None
    server = None
    if run_api:
        dispatcher = build_dispatcher(settings, client, projection)
        app = build_app(settings, projection, dispatcher, adapters)
        if tracing is not None:
            tracing.instrument_app(app)
        server = api_server(
            app, settings.api_host, settings.api_port, grace_s=settings.shutdown_grace_s
        )
        tasks.append(asyncio.create_task(server.serve(), name="api"))
        tasks.append(asyncio.create_task(dispatcher.run(stop=stop), name="dispatcher"))
        runner = app.state.context.batches
        tasks.append(asyncio.create_task(runner.run(stop=stop), name="batches"))
    # Webhook deliveries start from the process that commits them (services/webhooks.py).
    starter = WebhookStarter(
        projection.store,
        client,
        settings.temporal_task_queue,
        first_retry_s=settings.webhook_first_retry_s,
        longest_wait_s=settings.webhook_longest_wait_s,
        timeout_s=settings.webhook_timeout_s,
        sender=webhook_sender(settings, projection),
    )
    tasks.append(asyncio.create_task(starter.run(stop=stop), name="webhook starter"))
    if worker is not None:
        tasks.append(asyncio.create_task(worker.run(), name="worker"))
        gatherer = build_gatherer(settings, client, projection)
        tasks.append(asyncio.create_task(gatherer.run(stop=stop), name="provider batches"))
        tasks.append(
            asyncio.create_task(
                keep_registered(settings, projection.store.workers, stop), name="worker registry"
            )
        )
        tasks.append(
            asyncio.create_task(
                keep_retention_schedule(client, retention_policy(settings), stop),
                name="retention schedule",
            )
        )
    try:
        if server is not None:
            while not server.started:
                if tasks[0].done():
                    await tasks[0]
                    raise LaunchError(
                        f"the API did not start on {settings.api_host}:{settings.api_port}"
                    )
                await asyncio.sleep(0.02)
        # Everything built so far (modules, the app, models, the Temporal client) lives as
        # long as the process: out of the collector's sight, a full collection no longer
        # walks it (on the API under load: pauses of 100-180 ms each before).
        gc.freeze()
        if on_ready is not None:
            on_ready()
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopped, *tasks, *watch], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        for task in done:
            if task is not stopped and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if stopped not in done:
            # A part ended by itself (uvicorn after a fatal error, say): stop the rest.
            raise LaunchError(f"{next(iter(done)).get_name()} stopped unexpectedly")
    finally:
        stop.set()
        stop_by = asyncio.get_running_loop().time() + settings.shutdown_grace_s + STOP_SLACK_S
        # What the wait is for: each process of a stack says its own part.
        waits = []
        if server is not None:
            waits.append("the API lets its requests in flight finish and ends its streams")
        if worker is not None:
            waits.append(
                "the worker lets its calls in flight finish (one cut off at the end runs "
                "again, on any worker)"
            )
        log.warning("stopping: %s, for up to %g s", " and ".join(waits), settings.shutdown_grace_s)
        if server is not None:
            server.should_exit = True
            if projection.feed is not None:
                projection.feed.close()
        if worker is not None:
            await worker.shutdown()
        await stop_within(tasks, stop_by - asyncio.get_running_loop().time())


# What a stopping process's loops (the dispatcher's scan, the batch runner, the webhook
# starter…) get beyond the grace, from the stop, to end before they are cancelled.
STOP_SLACK_S = 5.0


async def stop_within(tasks: Sequence[asyncio.Task[Any]], seconds: float) -> None:
    """Wait for the parts of a stopping process to end; cancel, and name, any still running
    after `seconds`, so that a part that misses its stop (a pass over a long backlog, say)
    cannot keep the process from exiting. Nothing is lost by the cut: what a part had not
    done is still in the database for the next process."""
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=max(seconds, 0.0))
    for task in late:
        log.warning("%s did not stop in time: cancelled", task.get_name())
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_api(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    ensure_port_free(settings.api_host, settings.api_port, "API", "PROMPTJOBS_API_PORT")
    tracing = start_tracing(settings, "api")
    try:
        # Lazy: the API accepts submissions while Temporal is down; the dispatcher catches up.
        client = await connect_temporal(
            settings, lazy=True, interceptors=tracing.interceptors() if tracing else ()
        )
        async with open_projection(settings, listen=True) as projection:
            await serve(
                settings,
                client,
                projection,
                stop,
                run_worker=False,
                run_api=True,
                on_ready=lambda: log.warning(
                    "API on http://%s:%s", settings.api_host, settings.api_port
                ),
                tracing=tracing,
            )
    finally:
        if tracing is not None:
            tracing.shutdown()


async def run_worker(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    metrics = None
    if settings.worker_metrics_port is not None:
        ensure_port_free(
            settings.worker_metrics_host,
            settings.worker_metrics_port,
            "worker metrics",
            "PROMPTJOBS_WORKER_METRICS_PORT",
        )
        metrics = WorkerMetrics(settings)
    tracing = start_tracing(settings, "worker")
    client = await connect_with_retry(
        settings,
        stop,
        runtime=metrics.runtime if metrics else None,
        interceptors=tracing.interceptors() if tracing else (),
    )
    if client is None:
        return
    serving = asyncio.create_task(metrics.serve(stop)) if metrics else None
    try:
        async with open_projection(settings) as projection:
            await serve(
                settings,
                client,
                projection,
                stop,
                run_worker=True,
                run_api=False,
                on_ready=lambda: log.warning(
                    "worker %s polling %s", os.getpid(), settings.temporal_task_queue
                ),
            )
    finally:
        stop.set()
        if serving is not None:
            await serving
        if tracing is not None:
            tracing.shutdown()  # exports the spans still buffered


async def connect_with_retry(
    settings: Settings,
    stop: asyncio.Event,
    *,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Client | None:
    delay = 0.5
    while not stop.is_set():
        try:
            return await connect_temporal(settings, runtime=runtime, interceptors=interceptors)
        except Exception as err:
            log.warning("Temporal at %s unreachable (%s); retrying", settings.temporal_address, err)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                delay = min(delay * 2, 10)
    return None
