"""Wiring the CLI shares with the service: the projection, the adapters, the Temporal client,
the dispatcher and the job service, built from Settings. Nothing here loads the HTTP layer
(`promptjobs/runtime.py` builds the worker and the API on top of it)."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from temporalio.client import Client, Interceptor
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from activities.adapters.base import Adapter, AdapterRegistry
from activities.adapters.fake import FakeAdapter
from activities.adapters.routes import read_routes
from activities.prices import PriceTable
from projections.engines import create_engine, session_factory
from projections.group_commit import dispose
from projections.migrate import migrate_store, require_store
from projections.notifications import EventListener
from projections.projector import Projector
from projections.store import JobStore
from promptjobs.settings import Settings
from services.dispatch import Dispatcher
from services.jobs import JobService
from services.spend import SpendGate

if TYPE_CHECKING:
    from api.changes import ChangeFeed


@dataclass
class Projection:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    projector: Projector
    store: JobStore
    # The API's SSE fan-out; None where nothing serves streams (the CLI).
    feed: ChangeFeed | None


@asynccontextmanager
async def open_projection(
    settings: Settings,
    *,
    run_migrations: bool = True,
    listen: bool = False,
    streams: bool = True,
    create: bool = True,
) -> AsyncIterator[Projection]:
    """The projection store. With `listen` (API processes) on PostgreSQL, one dedicated
    connection LISTENs for job events committed by any process and wakes the ChangeFeed.
    Without `streams` (the CLI) there is no feed, and nothing of the HTTP layer is loaded.
    Without `create` (the operator's commands) a store that was never created is refused
    (StoreUnavailable), not made anew and empty."""
    url = settings.projection_url
    if not create:
        await asyncio.to_thread(require_store, url)
    if run_migrations:
        await asyncio.to_thread(migrate_store, url)
    engine = create_engine(
        url,
        pool_size=settings.database_pool_size,
        busy_timeout_s=settings.sqlite_busy_timeout_s,
    )
    sessions = session_factory(engine)
    feed = None
    if streams:
        # Only where streams are served: the CLI never loads the HTTP layer.
        from api.changes import ChangeFeed

        feed = ChangeFeed(
            max_streams=settings.sse_max_streams,
            max_streams_per_key=settings.sse_max_streams_per_key,
            buffer_events=settings.sse_buffer_events,
            poll_interval_s=settings.sse_poll_interval_s,
            key_check_s=settings.sse_key_check_s,
        )
    projector = Projector(
        sessions,
        on_commit=feed.notify if feed is not None else None,
        budget_window=timedelta(seconds=settings.budget_window_s),
    )
    store = JobStore(sessions, projector)
    if feed is not None:
        feed.attach(store.events_after, store.latest_event_id, store.keys.live_ids)
    listener = None
    if listen and feed is not None and engine.dialect.name == "postgresql":
        listener = asyncio.create_task(EventListener(url, feed.notify).run(), name="listen")
    try:
        yield Projection(engine, sessions, projector, store, feed)
    finally:
        if listener is not None:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
        await dispose(engine)


def build_adapters(settings: Settings) -> AdapterRegistry:
    """Every provider, with or without its credential: a job naming one that has none is
    refused at submission with the variable to set."""
    # Imported here: the SDKs take seconds to import, and only the processes that run or
    # accept jobs need them, not every CLI command.
    from activities.adapters.anthropic_messages import AnthropicMessagesAdapter
    from activities.adapters.openai_compat import OpenAICompatAdapter

    adapters: list[Adapter] = [
        FakeAdapter(enabled=settings.fake_adapter),
        OpenAICompatAdapter(
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url,
            timeout_s=settings.provider_timeout_s,
            model=settings.openai_model,
            max_tokens=settings.openai_max_tokens,
            max_tokens_field=settings.openai_max_tokens_field,
        ),
        AnthropicMessagesAdapter(
            api_key=settings.anthropic_api_key,
            base_url=settings.anthropic_base_url,
            timeout_s=settings.provider_timeout_s,
            model=settings.anthropic_model,
            max_tokens=settings.anthropic_max_tokens,
        ),
    ]
    routes = read_routes(settings.routes_file) if settings.routes_file else None
    return AdapterRegistry(
        {a.name: a for a in adapters}, default=settings.provider_default, routes=routes
    )


async def connect_temporal(
    settings: Settings,
    *,
    lazy: bool = False,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Client:
    """`runtime`: a worker's, exporting the SDK's metrics; `interceptors`: tracing's."""
    api_key = settings.temporal_api_key
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        tls=temporal_tls(settings),
        api_key=api_key.get_secret_value() if api_key else None,
        lazy=lazy,
        runtime=runtime,
        interceptors=interceptors,
    )


def temporal_tls(settings: Settings) -> bool | TLSConfig:
    if not settings.temporal_uses_tls:
        return False

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return TLSConfig(
        server_root_ca_cert=read(settings.temporal_tls_ca_path),
        domain=settings.temporal_tls_server_name,
        client_cert=read(settings.temporal_tls_cert_path),
        client_private_key=read(settings.temporal_tls_key_path),
    )


def build_dispatcher(settings: Settings, client: Client, projection: Projection) -> Dispatcher:
    return Dispatcher(
        projection.store,
        client,
        task_queue=settings.temporal_task_queue,
        ceiling_s=settings.job_ceiling_s,
        deferrable_ceiling_s=settings.deferrable_ceiling_s,
        attempt_timeout_s=settings.attempt_timeout_s,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        interval_s=settings.dispatcher_interval_s,
        reconcile_interval_s=settings.reconciler_interval_s,
        reconcile_grace_s=settings.reconciler_grace_s,
        org_max_running=settings.org_max_running,
        worker_heartbeat_s=settings.worker_heartbeat_s,
        max_starts=settings.dispatcher_max_starts,
        webhook_retries=(
            settings.webhook_first_retry_s,
            settings.webhook_longest_wait_s,
            settings.webhook_timeout_s,
        ),
    )


def build_job_service(
    settings: Settings, projection: Projection, dispatcher: Dispatcher, adapters: AdapterRegistry
) -> JobService:
    """The job actions, as the API and the CLI both use them."""
    return JobService(
        projection.store,
        dispatcher,
        adapters,
        max_attempts_default=settings.max_attempts_default,
        max_prompt_bytes=settings.max_prompt_bytes,
        max_image_bytes=settings.max_image_bytes,
        metrics_org_labels=settings.metrics_org_labels,
        max_jobs_per_prompt=settings.max_jobs_per_prompt,
        spend=SpendGate(
            projection.store.spend_caps,
            adapters,
            PriceTable.load(settings.prices_file),
            allow_unpriced=settings.caps_allow_unpriced,
        ),
    )


def disagreement_with_dev(settings: Settings) -> str | None:
    """What is wrong when this process reads `./run dev`'s store (its data directory's
    projection) but would reach Temporal elsewhere than that stack's dev server, as a shell
    that has not sourced `<data dir>/env` does: one line saying so, else None."""
    path = settings.data_dir / "env"
    if settings.database_url or not path.is_file():
        return None
    written: dict[str, str] = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.removeprefix("export ").partition("=")
        if sep and not line.startswith("#"):
            written[name.strip()] = " ".join(shlex.split(value))
    dev_address = written.get("PROMPTJOBS_TEMPORAL_ADDRESS")
    if dev_address is None or dev_address == settings.temporal_address:
        return None
    return (
        f"the store in {settings.data_dir} is `promptjobs dev`'s, whose Temporal is at "
        f"{dev_address}, but this command uses {settings.temporal_address}: "
        f"run `source {path}` first"
    )
