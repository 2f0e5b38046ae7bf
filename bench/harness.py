"""What every benchmark shares: a dev server, `promptjobs api`/`worker` processes, keys,
percentiles and the printed table."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import httpx2
from temporalio.testing import WorkflowEnvironment

from promptjobs.launch import DEV_SERVER_ARGS, dev_server_pids, lower_priority
from promptjobs.runtime import Projection, open_projection, temporal_cli
from promptjobs.settings import Settings
from workflows import search_attributes

# The processes' output, kept after the run for diagnosis (overwritten by the next run).
LOGS = Path(tempfile.gettempdir()) / "promptjobs-bench-logs"


def exit_on_sigterm() -> None:
    """`timeout` and Ctrl-C alike unwind the benchmark, so the processes it started stop."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


exit_on_sigterm()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load() -> str:
    """The 1/5/15-minute load averages, printed beside every figure (the machine is shared)."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass
class Report:
    """A benchmark's parameters, then its figures, printed last."""

    name: str
    params: dict[str, object]
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)

    def start(self) -> None:
        print(f"== {self.name}", flush=True)
        for key, value in self.params.items():
            print(f"  {key}: {value}", flush=True)
        print(f"  at start: {load()}", flush=True)

    def add(self, metric: str, value: str, target: str = "") -> None:
        self.rows.append((metric, value, target, load()))
        print(f"  .. {metric}: {value}", flush=True)

    def print(self) -> None:
        print()
        print(f"| {self.name} | figure | target | load (1/5/15 min) |")
        print("|---|---|---|---|")
        for metric, value, target, at in self.rows:
            print(f"| {metric} | {value} | {target} | {at.removeprefix('load ')} |")
        print(flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


@dataclass(frozen=True)
class Args:
    """A benchmark's arguments, in any order: a count; `postgresql` (the projection there,
    not on SQLite); `embedded` (the API and the worker in one process, as `promptjobs dev`
    ran them before its worker had a process of its own; `bench.dev_latency` measures `dev`);
    `pinned` (the Temporal server on CPU 0, everything else on CPU 1: see `pin_apart`);
    `noworker` (no worker runs: the jobs stay queued; `bench.submit_latency` only);
    `httpx` (the load from an httpx client, as many users' code sends it, instead of aiohttp;
    `bench.submit_latency` and `bench.dev_latency`); `httpx2` (the same from httpx2, the fork
    the `openai` and `anthropic` SDKs send with); `samenice` (the Temporal server at the
    same priority as our processes, as before `PROMPTJOBS_TEMPORAL_DEV_NICE`)."""

    count: int
    backend: str
    embedded: bool
    pinned: bool = False
    no_worker: bool = False
    client: str = "aiohttp"
    same_nice: bool = False

    @property
    def stack(self) -> str:
        processes = "one process: API + worker" if self.embedded else "api + worker processes"
        pinned = "; Temporal on CPU 0, the rest on CPU 1" if self.pinned else ""
        nice = "; Temporal at our priority" if self.same_nice else "; Temporal niced as in dev"
        return f"{processes}, {self.backend} projection{pinned}{nice}"


CLIENTS = ("aiohttp", "httpx", "httpx2")


def client_of(words: Sequence[str]) -> str:
    """The load's HTTP client named among a bench's arguments (aiohttp unless one is)."""
    return next((word for word in words if word in CLIENTS), "aiohttp")


def args(default_count: int) -> Args:
    words = sys.argv[1:]
    known = (*CLIENTS, "sqlite", "postgresql", "embedded", "pinned", "noworker", "samenice")
    unknown = [w for w in words if not w.isdigit() and w not in known]
    if unknown:
        raise SystemExit(
            f"unknown argument(s) {unknown}: expected [COUNT] [postgresql] [embedded] [pinned] "
            "[noworker] [httpx | httpx2] [samenice]"
        )
    counts = [int(w) for w in words if w.isdigit()]
    return Args(
        count=counts[0] if counts else default_count,
        backend="postgresql" if "postgresql" in words else "sqlite",
        embedded="embedded" in words,
        pinned="pinned" in words,
        no_worker="noworker" in words,
        client=client_of(words),
        same_nice="samenice" in words,
    )


def pin_apart() -> None:
    """The Temporal server on CPU 0, this process (and so every process it starts from now
    on) on CPU 1: the engine with a core of its own, as in a deployment where it runs on
    machines of its own, so our processes' cost no longer comes out of its throughput.
    Every thread of each is pinned; threads made later inherit their creator's set.
    PostgreSQL's backends are not ours to pin."""

    def pin(pid: int, cpus: set[int]) -> None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task.name), cpus)

    for task in Path("/proc/self/task").iterdir():
        for child in (task / "children").read_text().split():
            if role(int(child)) == "temporal":
                pin(int(child), {0})
    pin(os.getpid(), {1})


# -- whose CPU -----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (/proc/PID/stat)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK")


def role(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    if "bench.bare" in argv:
        return "bare worker"
    if "bench.embedded" in argv:
        return "api + worker"
    if "promptjobs" in argv:
        return argv[argv.index("promptjobs") + 1]
    return Path(argv[0]).name  # the Temporal dev server: `temporal`


def cpu_by_process() -> dict[str, float]:
    """CPU seconds so far of this process ("bench": the client and its polling) and of each
    process it started, by role; several of one role are added up."""
    used = {"bench": cpu_seconds(os.getpid())}
    for task in Path("/proc/self/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                name = role(int(child))
                used[name] = used.get(name, 0.0) + cpu_seconds(int(child))
    return used


class CpuMeter:
    """Whose CPU a figure is: each process's CPU seconds between the meter's start and
    `used()`. On this 2-core machine every CPU second of ours is one Temporal did not get."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.start = cpu_by_process()

    def used(self) -> dict[str, float]:
        now = cpu_by_process()
        return {name: now[name] - self.start.get(name, 0.0) for name in now}

    def per(self, n: int, unit: str = "job") -> str:
        """Each process's CPU per job, most first, and how busy the cores were since start."""
        used = self.used()
        wall = time.monotonic() - self.began
        parts = ", ".join(
            f"{name} {ms(seconds / n)}"
            for name, seconds in sorted(used.items(), key=lambda item: -item[1])
        )
        return f"{parts} per {unit}; busy {sum(used.values()) / wall:.2f} of {os.cpu_count()} cores"


# -- Temporal ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def dev_temporal(
    data_dir: Path, *, same_nice: bool = False
) -> AsyncIterator[WorkflowEnvironment]:
    """The dev server as `promptjobs dev` runs it: on-disk SQLite with the WAL pragmas, at
    the niceness of `PROMPTJOBS_TEMPORAL_DEV_NICE`'s default (with `same_nice`, at ours)."""
    env = await WorkflowEnvironment.start_local(
        ip="127.0.0.1",
        port=free_port(),
        search_attributes=search_attributes.ALL,
        dev_server_existing_path=temporal_cli(),
        dev_server_database_filename=str(data_dir / "temporal.db"),
        dev_server_extra_args=DEV_SERVER_ARGS,
        dev_server_log_level="error",
    )
    if not same_nice:
        for pid in dev_server_pids():
            lower_priority(pid, Settings.model_fields["temporal_dev_nice"].default)
    try:
        yield env
    finally:
        await env.shutdown()


@contextlib.asynccontextmanager
async def bench_stack(
    args: Args,
) -> AsyncIterator[tuple[Path, WorkflowEnvironment, dict[str, object]]]:
    """What one run of a benchmark stands on: a scratch folder, the dev server (pinned apart
    from the rest with `pinned`) and the service's overrides (a database of its own on
    PostgreSQL with `postgresql`)."""
    with scratch() as data_dir, contextlib.ExitStack() as stack:
        overrides: dict[str, object] = {}
        if args.backend == "postgresql":
            overrides["database_url"] = stack.enter_context(pg_database())
        async with dev_temporal(data_dir, same_nice=args.same_nice) as env:
            if args.pinned:
                pin_apart()
            yield data_dir, env, overrides


def target(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


# -- promptjobs processes ------------------------------------------------------------------


@dataclass
class Service:
    """`promptjobs api` and `promptjobs worker` processes sharing one projection; or, when
    `embedded`, one process running the API, its dispatcher and a worker (`bench.embedded`,
    as `promptjobs dev` runs them)."""

    settings: Settings
    temporal_address: str
    embedded: bool = False
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # More PROMPTJOBS_* variables for every process (a provider's base URL and key).
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        s = self.settings
        return {
            **os.environ,
            "PROMPTJOBS_TEMPORAL_ADDRESS": self.temporal_address,
            "PROMPTJOBS_TEMPORAL_TASK_QUEUE": s.temporal_task_queue,
            "PROMPTJOBS_DATABASE_URL": s.projection_url,
            "PROMPTJOBS_DATA_DIR": str(s.data_dir),
            "PROMPTJOBS_API_PORT": str(s.api_port),
            "PROMPTJOBS_HEARTBEAT_TIMEOUT_S": str(s.heartbeat_timeout_s),
            "PROMPTJOBS_SHUTDOWN_GRACE_S": "2",
            "PROMPTJOBS_FAKE_ADAPTER": "true",
            # One org submits everything here: no running limit, so the figures are the
            # path's and the engine's (the admission still runs, and is measured).
            "PROMPTJOBS_ORG_MAX_RUNNING": "0",
            **self.extra_env,
        }

    def spawn(self, command: str) -> subprocess.Popen[bytes]:
        """`api`, `worker` (`promptjobs` commands) or `embedded`."""
        LOGS.mkdir(parents=True, exist_ok=True)
        log = (LOGS / f"{command}-{len(self.processes)}.log").open("wb")
        module = ["bench.embedded"] if command == "embedded" else ["promptjobs", command]
        process = subprocess.Popen(
            [sys.executable, "-m", *module],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def start_worker(self) -> subprocess.Popen[bytes]:
        """The process that runs the worker: the embedded one, or a new `promptjobs worker`."""
        return self.processes[0] if self.embedded else self.spawn("worker")

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    async def start_api(self) -> subprocess.Popen[bytes]:
        process = self.spawn("embedded" if self.embedded else "api")
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=self.base_url) as http:
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args} exited with {process.returncode}")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/healthz")).status_code == 200:
                        return process
                await asyncio.sleep(0.1)
        raise RuntimeError("promptjobs api did not answer /healthz within 60 s")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def bench_settings(data_dir: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": data_dir,
        "api_port": free_port(),
        "temporal_task_queue": f"bench-{uuid.uuid4().hex[:8]}",
        "fake_adapter": True,
        "org_max_running": 0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def service(
    temporal_address: str,
    data_dir: Path,
    *,
    embedded: bool = False,
    extra_env: dict[str, str] | None = None,
    **overrides: object,
) -> AsyncIterator[tuple[Service, Projection, httpx.AsyncClient]]:
    """API process (real HTTP), no worker yet unless `embedded`; a projection and an
    authenticated client. `extra_env`: more variables for the processes."""
    settings = bench_settings(data_dir, **overrides)
    svc = Service(settings, temporal_address, embedded, extra_env=dict(extra_env or {}))
    async with open_projection(settings) as projection:
        try:
            await svc.start_api()
            key = (await projection.store.keys.create("acme", "alice", "member")).secret
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(
                base_url=svc.base_url,
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
                limits=limits,
            ) as http:
                yield svc, projection, http
        finally:
            svc.stop_all()


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="promptjobs-bench-") as path:
        yield Path(path)


PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """A database `promptjobs_bench_<random>` of its own, dropped after."""
    import psycopg

    name = f"promptjobs_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


async def count_in_state(projection: Projection, state: str) -> int:
    from sqlalchemy import func, select

    from projections.models import Job

    async with projection.sessions() as session:
        stmt = select(func.count()).select_from(Job).where(Job.state == state)
        return int((await session.execute(stmt)).scalar_one())


async def wait_for_count(
    projection: Projection, state: str, n: int, timeout: float, interval: float = 0.1
) -> float:
    """Poll until `n` jobs are in `state`; the monotonic time it happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await count_in_state(projection, state) >= n:
            return time.monotonic()
        await asyncio.sleep(interval)
    done = await count_in_state(projection, state)
    raise TimeoutError(f"only {done}/{n} jobs {state} after {timeout} s")


async def states(projection: Projection) -> dict[str, int]:
    from sqlalchemy import func, select

    from projections.models import Job

    async with projection.sessions() as session:
        stmt = select(Job.state, func.count()).group_by(Job.state)
        return {state.value: n for state, n in (await session.execute(stmt)).all()}


async def wait_settled(
    projection: Projection, n: int, timeout: float, interval: float = 0.2
) -> tuple[float, dict[str, int]]:
    """Poll until `n` jobs are terminal; when it happened (monotonic) and the states."""
    terminal = {"succeeded", "failed", "cancelled", "superseded"}
    deadline = time.monotonic() + timeout
    while True:
        counts = await states(projection)
        if sum(v for k, v in counts.items() if k in terminal) >= n:
            return time.monotonic(), counts
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs not all settled after {timeout} s: {counts}")
        await asyncio.sleep(interval)


async def submit_many(
    http: httpx.AsyncClient,
    n: int,
    concurrency: int,
    body: dict[str, object],
    *,
    client: str = "aiohttp",
    warm: bool = False,
) -> list[float]:
    """Submit `n` prompts with `concurrency` in flight; each request's latency in seconds.

    The load comes from aiohttp on `http`'s base URL and headers, not from httpx itself: at
    32 in flight httpx's client took more CPU than the API on this 2-core machine and doubled
    the latencies it reported (bench/README.md). `client="httpx"`: from `http` all the same,
    as a user's httpx code sends it (the client's own CPU then counts in the figures);
    `"httpx2"`: from an httpx2 client with `http`'s base URL and headers. `warm`: first,
    `concurrency` submissions at once, not timed (and not counted in `n`), open the client's
    connections, so the figures are those of a warm pool (a service's steady state), not of
    its first connects (at 32 in flight those made a 960-request run's p99 on their own)."""
    if client == "httpx":
        return await _submit_many_httpx(http, n, concurrency, body, warm)
    if client == "httpx2":
        async with httpx2.AsyncClient(
            base_url=str(http.base_url),
            headers={"Authorization": http.headers["Authorization"]},
            timeout=60,
            limits=httpx2.Limits(max_connections=200, max_keepalive_connections=200),
        ) as http2:
            return await _submit_many_httpx(http2, n, concurrency, body, warm)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        str(http.base_url),
        headers={"Authorization": http.headers["Authorization"]},
        connector=connector,
    ) as session:

        async def send(prompt: str) -> None:
            async with session.post("/v1/prompts", json={**body, "prompt": prompt}) as r:
                text = await r.text()
            if r.status != 202:
                raise RuntimeError(f"submit answered {r.status}: {text}")

        return await timed(send, n, concurrency, warm)


async def _submit_many_httpx(
    http: httpx.AsyncClient | httpx2.AsyncClient,
    n: int,
    concurrency: int,
    body: dict[str, object],
    warm: bool,
) -> list[float]:
    async def send(prompt: str) -> None:
        response = await http.post("/v1/prompts", json={**body, "prompt": prompt})
        if response.status_code != 202:
            raise RuntimeError(f"submit answered {response.status_code}: {response.text}")

    return await timed(send, n, concurrency, warm)


async def timed(
    send: Callable[[str], Awaitable[None]], n: int, concurrency: int, warm: bool
) -> list[float]:
    """`n` sends, `concurrency` at a time, each one's latency in seconds (`warm`: after
    `concurrency` untimed ones at once)."""
    if warm:
        await asyncio.gather(*(send(f"bench warm-up {k}") for k in range(concurrency)))
    latencies: list[float] = []
    queue = iter(range(n))

    async def submitter() -> None:
        for i in queue:
            started = time.perf_counter()
            await send(f"bench {i}")
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(submitter() for _ in range(concurrency)))
    return latencies


async def wait_for_pollers(
    env: WorkflowEnvironment, task_queue: str, count: int = 1, timeout: float = 60
) -> None:
    """Until `count` workers poll `task_queue` for activities (they have started)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = await env.client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=env.client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        if len(described.pollers) >= count:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no worker polled {task_queue} within {timeout} s")


# -- the mock provider ----------------------------------------------------------------------


def start_mock_provider(args: Sequence[str]) -> tuple[subprocess.Popen[bytes], str]:
    LOGS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, "-m", "promptjobs", "mock-provider", "--port", str(port), *args]
    with (LOGS / "mock-provider.log").open("wb") as log:
        mock = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return mock, f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def mock_provider(*args: str) -> AsyncIterator[str]:
    """`promptjobs mock-provider` (with `args`, e.g. `--rpm 60`) on a free port, until the
    block ends: its base URL."""
    mock, url = start_mock_provider(args)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            for _ in range(200):
                try:
                    (await http.get("/mock/requests")).raise_for_status()
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"the mock provider did not answer at {url}")
        yield url
    finally:
        mock.terminate()
        mock.wait(10)
