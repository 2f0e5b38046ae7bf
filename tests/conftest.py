"""Fixtures every test reuses: projection stores (SQLite and PostgreSQL), Temporal servers, a
running promptjobs stack over real HTTP."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import random
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from promptjobs.launch import DEV_SERVER_ARGS, STOP_SLACK_S, serve
from promptjobs.runtime import (
    Projection,
    build_adapters,
    build_worker,
    open_projection,
    temporal_cli,
)
from promptjobs.settings import Settings
from promptjobs.tracing import Tracing
from workflows import search_attributes

PG_ADMIN_URL = os.environ.get("PROMPTJOBS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

T = TypeVar("T")


# Ports for the servers tests start: below the kernel's ephemeral range (32768 and up), so no
# outgoing connection takes one between its choice and its bind, and picked at random, so the
# suite's processes side by side (./run test) do not pick the same one. A port asked of the
# kernel (bind to 0) is from the ephemeral range, and was seen taken before its server bound it.
TEST_PORTS = range(10_000, 32_000)


def free_port() -> int:
    while True:
        port = random.choice(TEST_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


async def eventually(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], bool],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
) -> T:
    """Poll `probe` until `until(value)` holds; fail with the last value after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await probe()
        if until(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s; last value: {value!r}")
        await asyncio.sleep(interval)


# -- databases ---------------------------------------------------------------------------


@contextmanager
def new_pg_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards (its connections with it)."""
    name = f"promptjobs_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this run, dropped at the end."""
    with new_pg_database() as url:
        yield url


@pytest.fixture
def fresh_pg_database() -> Iterator[str]:
    """An empty PostgreSQL database of this test's own (for tests with other processes)."""
    with new_pg_database() as url:
        yield url


BOTH_DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`database_url` (and the `stack`, `projection` on it) is SQLite, and PostgreSQL too
    where the database is what a test is about: a module that says `BOTH_DATABASES = True`,
    or a test marked `both_databases`. A module with a `database_url` of its own keeps it."""
    if "database_url" not in metafunc.fixturenames or "database_url" in vars(metafunc.module):
        return
    both = getattr(metafunc.module, "BOTH_DATABASES", False) or (
        metafunc.definition.get_closest_marker("both_databases") is not None
    )
    metafunc.parametrize("database_url", BOTH_DATABASES if both else ["sqlite"], indirect=True)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test on the shared PostgreSQL server is marked `postgres` (those on a database
    of their own from `pg_database` or `fresh_pg_database` too): `./run test` runs them in
    one process, in turn, beside the others on several workers. Each has a database of its
    own, but a transaction open in one holds back the event horizon (pg_snapshot_xmin) of
    the whole server, which another's reads of new events would wait on."""
    if {"pg_database", "fresh_pg_database"} & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.postgres)


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if getattr(request, "param", "sqlite") == "sqlite":
        yield f"sqlite:///{tmp_path / 'projection.db'}"
        return
    url: str = request.getfixturevalue("pg_database")
    yield url
    # The run's PostgreSQL database is shared by the tests in turn: each leaves it empty,
    # whatever it opened on it (a stack, a projection of its own, other processes).
    empty_tables(url)


def empty_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'alembic_version'"
            )
        ]
        if tables:
            names = ", ".join(f'"{name}"' for name in tables)
            conn.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def make_settings(tmp_path: Path, *, migrated: bool = True, **overrides: Any) -> Settings:
    """The tests' settings. Unless `migrated` is False, an SQLite store they name that does
    not exist yet starts as a copy of one migrated once per test process: the same schema at
    head, without running every migration again for each test (~0.4 s of CPU each; the
    migrations themselves are tested from empty in test_migrations.py and test_old_events.py)."""
    values: dict[str, Any] = {
        "data_dir": tmp_path,
        "temporal_task_queue": f"tq-{uuid.uuid4().hex[:8]}",
        "dispatcher_interval_s": 0.2,
        "sse_poll_interval_s": 0.05,
        "sse_keepalive_s": 1.0,
        "heartbeat_timeout_s": 2.0,
        "shutdown_grace_s": 2.0,
        # Tests read the queue-depth gauge right after changing it.
        "metrics_cache_s": 0.0,
        # No retention schedule on the shared dev server unless a test asks for one.
        "retention_days": 0.0,
        # The tests run their jobs on the fake provider (off by default outside `dev`).
        "fake_adapter": True,
        # Every check of Temporal's sandbox on, each workflow run importing its module afresh:
        # workflow code that is not deterministic fails here (a deployment shares the module).
        "worker_workflow_sandbox": "strict",
    }
    values.update(overrides)
    settings = Settings(**values)
    if migrated:
        _from_migrated_template(settings.projection_url)
    return settings


_TEMPLATE: list[Path] = []


def _from_migrated_template(url: str) -> None:
    from sqlalchemy.engine import make_url

    from projections.migrate import migrate

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return
    store = Path(parsed.database)
    if parsed.database == ":memory:" or store.exists():
        return
    if not _TEMPLATE:
        made = Path(tempfile.mkdtemp(prefix="promptjobs-template-")) / "promptjobs.db"
        migrate(f"sqlite:///{made}")
        atexit.register(shutil.rmtree, made.parent, True)
        _TEMPLATE.append(made)
    store.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_TEMPLATE[0], store)


@pytest.fixture
async def projection(database_url: str, tmp_path: Path) -> AsyncIterator[Projection]:
    settings = make_settings(tmp_path, database_url=database_url)
    async with open_projection(settings) as projection:
        yield projection
        if projection.engine.dialect.name == "postgresql":
            await _truncate(projection)


async def _truncate(projection: Projection) -> None:
    from sqlalchemy import text

    async with projection.engine.begin() as conn:
        await conn.execute(
            text(
                "TRUNCATE api_keys, responses, job_events, job_outputs, attempts, jobs, prompts, "
                "workers, org_limits, provider_budgets, provider_circuits, budget_draws, "
                "budget_waiters, spend_holds, spend_waiters, files, file_chunks, batch_lines, "
                "batches, provider_batches, deferred_jobs, webhook_endpoints, webhook_deliveries, "
                "webhook_signing "
                "RESTART IDENTITY CASCADE"
            )
        )


# -- Temporal ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    from shutil import which

    path = which("temporal-test-server") or str(
        Path(temporal_cli()).parent / "temporal-test-server"
    )
    env = await WorkflowEnvironment.start_time_skipping(test_server_existing_path=path)
    await register_search_attributes(env.client)
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
async def dev_server() -> AsyncIterator[WorkflowEnvironment]:
    """The real Temporal dev server (in memory), as `promptjobs dev` runs it."""
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        search_attributes=search_attributes.ALL,
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=DEV_SERVER_ARGS,
        dev_server_log_level="error",
    )
    yield env
    await env.shutdown()


async def register_search_attributes(client: Client) -> None:
    """The time-skipping server has no flag for it; register through the operator service."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest

    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                key.name: IndexedValueType.ValueType(key.indexed_value_type)
                for key in search_attributes.ALL
            },
        )
    )


def new_worker(settings: Settings, client: Client, projection: Projection) -> Worker:
    return build_worker(settings, client, projection, build_adapters(settings))


# -- a whole running service -------------------------------------------------------------


@dataclass
class Stack:
    settings: Settings
    base_url: str
    client: Client
    projection: Projection
    http: httpx.AsyncClient
    api_key: str

    def as_user(self, key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10
        )

    async def key(self, org: str, user: str, role: str = "member") -> str:
        return (await self.projection.store.keys.create(org, user, role)).secret

    async def job(self, job_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def settled(self, job_id: str, timeout: float = 20.0) -> dict[str, Any]:
        from projections.domain.lifecycle import JobState

        return await eventually(
            lambda: self.job(job_id), lambda j: JobState(j["state"]).is_terminal, timeout=timeout
        )

    async def submit(self, prompt: str = "hello", **body: Any) -> dict[str, Any]:
        response = await self.http.post("/v1/prompts", json={"prompt": prompt, **body})
        assert response.status_code == 202, response.text
        accepted: dict[str, Any] = response.json()
        return accepted


@asynccontextmanager
async def running_stack(
    settings: Settings, client: Client, *, run_worker: bool = True, tracing: Tracing | None = None
) -> AsyncIterator[Stack]:
    """API (real HTTP on a free port), dispatcher and, unless told not to, a worker."""
    settings = settings.model_copy(update={"api_port": free_port()})
    async with open_projection(settings, listen=True) as projection:
        stop = asyncio.Event()
        ready = asyncio.Event()
        task = asyncio.create_task(
            serve(
                settings,
                client,
                projection,
                stop,
                run_worker=run_worker,
                run_api=True,
                on_ready=ready.set,
                tracing=tracing,
            )
        )
        ready_wait = asyncio.create_task(ready.wait())
        await asyncio.wait([task, ready_wait], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            await task
        key = (await projection.store.keys.create("acme", "alice", "member")).secret
        base_url = f"http://{settings.api_host}:{settings.api_port}"
        async with httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10
        ) as http:
            try:
                yield Stack(settings, base_url, client, projection, http, key)
            finally:
                stop.set()
                # Bounded: a test cut off by its timeout mid-run must not leave its teardown
                # waiting for ever on a part the cut left broken.
                bound = settings.shutdown_grace_s + STOP_SLACK_S + 30
                try:
                    await asyncio.wait_for(task, bound)
                except TimeoutError:
                    raise AssertionError(f"the stack did not stop within {bound:g} s") from None
        if projection.engine.dialect.name == "postgresql":
            await _truncate(projection)


# -- the mock provider --------------------------------------------------------------------


@dataclass
class MockProviderServer:
    """The mock provider (promptjobs/mock_provider.py) on a free port, and its admin calls."""

    url: str
    http: httpx.AsyncClient

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    async def requests(self, prompt: str | None = None) -> list[dict[str, Any]]:
        """What arrived, oldest first; only the requests for `prompt` if given."""
        response = await self.http.get("/mock/requests")
        response.raise_for_status()
        seen: list[dict[str, Any]] = response.json()["requests"]
        return [r for r in seen if prompt is None or r["prompt"] == prompt]

    async def script(self, **script: Any) -> None:
        """Script the next requests, whatever their prompt (`fail=[503]`, `retry_after=2`…)."""
        (await self.http.post("/mock/script", json=script)).raise_for_status()

    async def answer(self, prompt: str, directive: str = "") -> str:
        """The mock's whole answer to `prompt`, asked for without a stream; `directive` (the
        part after `mock:`) is the model's, so a directive in the prompt is not played."""
        response = await self.http.post(
            "/v1/chat/completions",
            headers={"Authorization": "Bearer mock-key"},
            json={"model": f"mock:{directive}", "messages": [{"role": "user", "content": prompt}]},
        )
        response.raise_for_status()
        text: str = response.json()["choices"][0]["message"]["content"]
        return text


@pytest.fixture(scope="session")
async def mock_provider() -> AsyncIterator[MockProviderServer]:
    from promptjobs.mock_provider import run_mock_provider

    port = free_port()
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_mock_provider("127.0.0.1", port, stop=stop, on_ready=ready.set))
    ready_wait = asyncio.create_task(ready.wait())
    await asyncio.wait([task, ready_wait], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        await task
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield MockProviderServer(url, http)
    stop.set()
    await task


def provider_settings(tmp_path: Path, mock: MockProviderServer, **overrides: Any) -> Settings:
    """Settings whose `openai` and `anthropic` providers are the mock, with short delays."""
    values: dict[str, Any] = {
        "openai_base_url": mock.openai_base_url,
        "openai_api_key": "mock-key",
        "anthropic_base_url": mock.anthropic_base_url,
        "anthropic_api_key": "mock-key",
        # Generous: a hang test sets its own short limit.
        "provider_timeout_s": 5.0,
        "backoff_initial_s": 1.0,
        "backoff_coefficient": 1.0,
        "backoff_jitter": 0.0,
        "rate_limit_default_s": 1.0,
    }
    values.update(overrides)
    return make_settings(tmp_path, **values)


@pytest.fixture(scope="module")
async def provider_stack(
    dev_server: WorkflowEnvironment,
    mock_provider: MockProviderServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    """A stack (SQLite) whose `openai` and `anthropic` providers are the mock, one a module."""
    settings = provider_settings(tmp_path_factory.mktemp("providers"), mock_provider)
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


@pytest.fixture
async def stack(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    settings = make_settings(tmp_path, database_url=database_url)
    async with running_stack(settings, dev_server.client) as running:
        yield running


# -- shared helpers -----------------------------------------------------------------------


def parse_time(value: str) -> datetime:
    """A timestamp as the API writes it (UTC ISO-8601 with `Z`)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def cli_env(stack: Stack, **overrides: str) -> dict[str, str]:
    """How an operator points the CLI at the service: the same PROMPTJOBS_* settings."""
    return {
        "PROMPTJOBS_DATABASE_URL": stack.settings.projection_url,
        "PROMPTJOBS_TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
        "PROMPTJOBS_TEMPORAL_TASK_QUEUE": stack.settings.temporal_task_queue,
        "PROMPTJOBS_DATA_DIR": str(stack.settings.data_dir),
        "PROMPTJOBS_ORG_MAX_RUNNING": str(stack.settings.org_max_running),
        "PROMPTJOBS_BUDGET_WINDOW_S": str(stack.settings.budget_window_s),
        "PROMPTJOBS_FAKE_ADAPTER": "true",
        # Tables as wide as a terminal of 200 columns, wherever the tests run.
        "COLUMNS": "200",
        **overrides,
    }


async def cli(stack: Stack, *args: str, **env: str) -> Any:
    """`promptjobs <args>` against the stack, as an operator runs it; its click Result."""
    from typer.testing import CliRunner

    from promptjobs.cli import app

    # A thread of its own: the command runs its own event loop, as it does from a shell.
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env=cli_env(stack, **env))
    assert result.exception is None, (result.output, result.exception)
    assert result.exit_code == 0, result.output
    return result


async def cli_json(stack: Stack, *args: str, **env: str) -> Any:
    return json.loads((await cli(stack, *args, "--json", **env)).output)
