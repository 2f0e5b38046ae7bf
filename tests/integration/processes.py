"""Real `promptjobs` processes for tests: configured by environment, always stopped afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from promptjobs.launch import DEV_SERVER_ARGS
from promptjobs.runtime import temporal_cli
from promptjobs.settings import Settings
from tests.conftest import eventually, free_port
from workflows import search_attributes

PROMPTJOBS = str(Path(sys.executable).parent / "promptjobs")


async def temporal_on_disk(port: int, database: Path) -> WorkflowEnvironment:
    """A dev server on `port` that keeps its state in `database`: stopped, it can be started
    again with everything it had (a Temporal restart)."""
    return await WorkflowEnvironment.start_local(
        port=port,
        search_attributes=search_attributes.ALL,
        dev_server_existing_path=temporal_cli(),
        dev_server_database_filename=str(database),
        dev_server_extra_args=DEV_SERVER_ARGS,
        dev_server_log_level="error",
    )


def temporal_address(env: WorkflowEnvironment) -> str:
    """Where a process started by a test reaches the test's Temporal server."""
    return env.client.service_client.config.target_host


def process_env(settings: Settings, **extra: object) -> dict[str, str]:
    """The environment of a `promptjobs api|worker` that shares `settings`' Temporal task queue,
    database and timeouts (the in-process dispatcher must agree on the heartbeat)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTJOBS_")}
    env.pop("DATABASE_URL", None)
    env.update(
        {
            "PROMPTJOBS_TEMPORAL_ADDRESS": settings.temporal_address,
            "PROMPTJOBS_TEMPORAL_TASK_QUEUE": settings.temporal_task_queue,
            "PROMPTJOBS_DATABASE_URL": settings.projection_url,
            "PROMPTJOBS_DATA_DIR": str(settings.data_dir),
            "PROMPTJOBS_HEARTBEAT_TIMEOUT_S": str(settings.heartbeat_timeout_s),
            "PROMPTJOBS_SHUTDOWN_GRACE_S": str(settings.shutdown_grace_s),
            "PROMPTJOBS_DISPATCHER_INTERVAL_S": str(settings.dispatcher_interval_s),
            "PROMPTJOBS_RETENTION_DAYS": str(settings.retention_days),
            "PROMPTJOBS_FAKE_ADAPTER": str(settings.fake_adapter).lower(),
        }
    )
    env.update({f"PROMPTJOBS_{k.upper()}": str(v) for k, v in extra.items()})
    return env


@dataclass
class Process:
    command: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self) -> None:
        self.popen.send_signal(signal.SIGTERM)

    async def ready(self, timeout: float = 30.0) -> Process:
        """Wait for the line the launcher logs once it is up (the worker polls, the API
        listens)."""
        marker = f"worker {self.pid} polling" if self.command == "worker" else "API on http://"

        async def state() -> str:
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.popen.returncode}:\n{self.output()}"
                )
            return self.output()

        await eventually(state, lambda out: marker in out, timeout=timeout)
        return self

    async def exited(self, timeout: float = 30.0) -> int:
        async def code() -> int | None:
            return self.popen.poll()

        try:
            await eventually(code, lambda c: c is not None, timeout=timeout)
        except AssertionError as err:
            raise AssertionError(f"{self.name} still running:\n{self.output()}") from err
        assert self.popen.returncode is not None
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


@contextmanager
def promptjobs_process(
    command: str, env: dict[str, str], workdir: Path, *args: str
) -> Iterator[Process]:
    """Start `promptjobs <command> <args>`; SIGKILL it on the way out if it is still running."""
    workdir.mkdir(parents=True, exist_ok=True)
    name = f"{command}-{len(list(workdir.glob('*.log')))}"
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [PROMPTJOBS, command, *args],
            env=env,
            cwd=workdir,  # so no .env of the checkout is read
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    process = Process(command, name, popen, log)
    try:
        yield process
    finally:
        process.kill()


@dataclass
class DevProcess:
    """`promptjobs dev` as a user runs it, in `home`, on free ports; what it printed."""

    home: Path
    api_url: str
    process: asyncio.subprocess.Process
    printed: list[str]

    @classmethod
    async def start(cls, home: Path, *args: str, env: dict[str, str]) -> DevProcess:
        """Started, and its banner out (up to the line saying what a second shell sources)."""
        api_port = free_port()
        process = await asyncio.create_subprocess_exec(
            PROMPTJOBS, "dev", "--no-ui",
            "--api-port", str(api_port), "--temporal-port", str(free_port()), *args,
            cwd=home, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        dev = cls(home, f"http://127.0.0.1:{api_port}", process, [])
        try:
            assert process.stdout is not None
            async with asyncio.timeout(60):
                while not any("source " in line for line in dev.printed):
                    line = (await process.stdout.readline()).decode()
                    assert line, f"dev exited early: {''.join(dev.printed)}"
                    dev.printed.append(line)
        except BaseException:
            await dev.stop()
            raise
        return dev

    async def stop(self) -> str:
        """Ctrl-C, as a user stops it (killed if it has not stopped within 30 s): everything
        it printed."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(30):
                    rest, _ = await self.process.communicate()
                    self.printed.append(rest.decode())
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        return "".join(self.printed)
