"""A PostgreSQL server of a test's own (initdb + pg_ctl on a free port), to stop and start."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port

OS_USER = "postgres"


def _bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _as_postgres(*argv: str) -> list[str]:
    """PostgreSQL refuses to run as root: run as the `postgres` OS user when we are root."""
    if os.geteuid() != 0:
        return list(argv)
    return ["runuser", "-u", OS_USER, "--", *argv]


@dataclass
class OwnPostgres:
    bindir: Path
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        done = subprocess.run(
            _as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.data), *args),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            log = self.data / "server.log"
            raise subprocess.CalledProcessError(
                done.returncode,
                done.args,
                done.stdout,
                f"{done.stderr}\n{log.read_text() if log.exists() else ''}",
            )

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories="
        self._pg_ctl("-w", "-o", options, "-l", str(self.data / "server.log"), "start")

    def stop(self, mode: str = "immediate") -> None:
        """`immediate` is a crash as clients see it: every connection drops at once."""
        self._pg_ctl("-w", "-m", mode, "stop")


@contextmanager
def own_postgres(tmp_path: Path) -> Iterator[OwnPostgres]:
    bindir = _bindir()
    if bindir is None or not (bindir / "initdb").exists():
        pytest.skip("PostgreSQL server binaries (pg_config --bindir) are not installed")
    root = tmp_path / "own-postgres"
    root.mkdir()
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, OS_USER)
        # The way down to the data directory must be passable for the postgres user.
        for parent in root.parents:
            if parent == Path("/tmp") or parent == parent.parent:
                break
            parent.chmod(parent.stat().st_mode | 0o011)
    subprocess.run(
        _as_postgres(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"),
        check=True,
        capture_output=True,
    )
    server = OwnPostgres(bindir, data, free_port())
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
