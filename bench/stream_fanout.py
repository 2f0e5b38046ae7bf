"""Event streams at scale: commit → SSE client with 1, 100, 1,000 open streams on one API process.

    .venv/bin/python -m bench.stream_fanout [--streams 1,100,1000] [--db sqlite,postgresql]
        [--commits 40] [--code DIR]

One `promptjobs api`-shaped process (this file run with `--serve`: `run_api` plus a
SQLAlchemy `before_cursor_execute` counter, written to a file every 50 ms), a client process
(this file with `--client`: raw asyncio sockets, so the client's own CPU stays small) that
opens the streams split across 4 orgs (admin keys), and this process, which commits
submissions through a projection of its own, as a worker process would (the API learns of
them by LISTEN/NOTIFY on PostgreSQL, by its poll on SQLite), round-robin across the orgs,
every 0.1 s. Latency: an event's arrival at the client minus the row's `updated_at` (set in
the transaction, just before COMMIT); same machine, same clock. `--code DIR` runs the API
process on another checkout's code (e.g. `git archive main` unpacked), for before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ORGS = 4
COMMIT_EVERY_S = 0.1
HERE = Path(__file__).resolve()


# -- the API process ------------------------------------------------------------------------


def serve(stats: Path) -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from promptjobs.launch import run_api
    from promptjobs.settings import Settings

    statements = 0

    def count(*_: Any) -> None:
        nonlocal statements
        statements += 1

    event.listen(Engine, "before_cursor_execute", count)

    def write() -> None:
        scratch = stats.with_suffix(".tmp")
        while True:
            scratch.write_text(str(statements))
            scratch.replace(stats)  # atomic: a reader never sees a half-written file
            time.sleep(0.05)

    threading.Thread(target=write, daemon=True).start()
    asyncio.run(run_api(Settings()))


# -- the client process ---------------------------------------------------------------------


async def client(port: int, keys: list[str], streams: int, expect: int, timeout_s: float) -> None:
    latencies: list[float] = []
    connected = 0
    all_connected = asyncio.Event()
    done = 0

    async def stream(key: str) -> None:
        nonlocal connected, done
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.write(
            f"GET /v1/events HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        status = await reader.readline()
        assert b" 200 " in status, status
        got = 0
        counted = False
        while got < expect:
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b": connected") and not counted:
                counted = True
                connected += 1
                if connected == streams:
                    all_connected.set()
            elif line.startswith(b"data:"):
                arrived = time.time()
                at = line.find(b'"updated_at":"') + 14
                if at == 13:
                    continue  # not a job's row (bench.stream_load's streams see other events)
                stamp = line[at : line.find(b'"', at)].decode()
                updated = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                latencies.append(arrived - updated.timestamp())
                got += 1
        done += 1
        writer.close()

    tasks = [asyncio.create_task(stream(keys[i % len(keys)])) for i in range(streams)]
    await asyncio.wait_for(all_connected.wait(), 120)
    print("ready", flush=True)
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    print(json.dumps({"latencies": latencies, "complete": done}), flush=True)


# -- the driver -----------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_api(stats: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    from bench.harness import LOGS

    LOGS.mkdir(parents=True, exist_ok=True)
    log = (LOGS / "stream-fanout-api.log").open("wb")
    return subprocess.Popen(
        [sys.executable, str(HERE), "--serve", str(stats)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=cwd,
    )


def start_client(options: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE), "--client", json.dumps(options)],
        stdout=subprocess.PIPE,
    )


async def run_once(
    database_url: str, streams: int, commits: int, code: str | None
) -> dict[str, Any]:
    from bench.harness import free_port, percentile, scratch
    from projections.scope import Scope
    from projections.writes import Submission
    from promptjobs.runtime import open_projection
    from promptjobs.settings import Settings

    with scratch() as data_dir:
        port = free_port()
        stats = data_dir / "statements"
        settings = Settings(data_dir=data_dir, database_url=database_url)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PROMPTJOBS_")},
            "PROMPTJOBS_DATABASE_URL": database_url,
            "PROMPTJOBS_DATA_DIR": str(data_dir),
            "PROMPTJOBS_API_PORT": str(port),
            # Nothing listens there: this measures the projection and the streams.
            "PROMPTJOBS_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
            "PROMPTJOBS_DISPATCHER_INTERVAL_S": "3600",
            "PROMPTJOBS_RECONCILER_INTERVAL_S": "3600",
            "PROMPTJOBS_SSE_MAX_STREAMS_PER_KEY": "1000",
            "PROMPTJOBS_SSE_KEEPALIVE_S": "15",
        }
        if code:
            env["PYTHONPATH"] = code
        async with open_projection(settings) as projection:
            keys = [
                (await projection.store.keys.create(f"org{i}", "admin", "admin")).secret
                for i in range(ORGS)
            ]
            scopes = [Scope(f"org{i}", "admin", "admin") for i in range(ORGS)]
            api = start_api(stats, env, data_dir)
            try:
                await wait_healthy(port, api)
                rss_idle = rss_mb(api.pid)
                per_stream = commits // ORGS
                reader = start_client(
                    {
                        "port": port,
                        "keys": keys,
                        "streams": streams,
                        "expect": per_stream,
                        "timeout_s": 120,
                    }
                )
                assert reader.stdout is not None
                line = await asyncio.to_thread(reader.stdout.readline)
                assert line.strip() == b"ready", line
                await asyncio.sleep(1.0)
                rss_open = rss_mb(api.pid)
                idle_from = int(stats.read_text())
                await asyncio.sleep(2.0)
                idle_per_s = (int(stats.read_text()) - idle_from) / 2.0
                cpu_before, began = cpu_s(api.pid), time.monotonic()
                statements_before = int(stats.read_text())
                later = datetime.now(UTC) + timedelta(days=1)
                for i in range(per_stream * ORGS):
                    started = time.monotonic()
                    await projection.store.submit(
                        scopes[i % ORGS],
                        Submission(f"fanout {i}", 50, 1, {}, scheduled_for=later),
                    )
                    await asyncio.sleep(max(0.0, COMMIT_EVERY_S - (time.monotonic() - started)))
                out = await asyncio.to_thread(reader.stdout.readline)
                elapsed = time.monotonic() - began
                await asyncio.sleep(0.2)
                statements = int(stats.read_text()) - statements_before
                cpu = cpu_s(api.pid) - cpu_before
                reader.wait(timeout=30)
            finally:
                api.terminate()
                api.wait(timeout=30)
        result = json.loads(out)
        lat = result["latencies"]
        n = per_stream * ORGS
        return {
            "streams": streams,
            "delivered": f"{len(lat)}/{per_stream * streams}",
            "p50_ms": percentile(lat, 50) * 1000,
            "p99_ms": percentile(lat, 99) * 1000,
            "sql_per_commit": (statements - idle_per_s * elapsed) / n,
            "sql_idle_per_s": idle_per_s,
            "cpu_pct": 100 * cpu / elapsed,
            "rss_streams_mb": rss_open - rss_idle,
        }


async def wait_healthy(port: int, process: subprocess.Popen[bytes]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        for _ in range(600):
            if process.poll() is not None:
                raise RuntimeError(f"the API exited with {process.returncode}")
            try:
                if (await http.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the API did not come up")


async def main(args: argparse.Namespace) -> None:
    from bench.harness import load, pg_database

    label = args.code or "this checkout"
    print(f"== stream fan-out ({label}); {load()}", flush=True)
    print(
        "| db | streams | delivered | p50 | p99 | SQL per commit | idle SQL/s | API CPU | "
        "API RSS for the streams | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for db in args.db.split(","):
        for streams in [int(n) for n in args.streams.split(",")]:
            if db == "postgresql":
                with pg_database() as url:
                    row = await run_once(url, streams, args.commits, args.code)
            else:
                import tempfile

                with tempfile.TemporaryDirectory() as tmp:
                    url = f"sqlite:///{Path(tmp) / 'bench.db'}"
                    row = await run_once(url, streams, args.commits, args.code)
            print(
                f"| {db} | {row['streams']} | {row['delivered']} | {row['p50_ms']:.1f} ms | "
                f"{row['p99_ms']:.1f} ms | {row['sql_per_commit']:.1f} | "
                f"{row['sql_idle_per_s']:.0f} | {row['cpu_pct']:.0f} % | "
                f"{row['rss_streams_mb']:.1f} MiB | {load().removeprefix('load ')} |",
                flush=True,
            )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]))
    elif len(sys.argv) > 2 and sys.argv[1] == "--client":
        options = json.loads(sys.argv[2])
        asyncio.run(client(**options))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--streams", default="1,100,1000")
        parser.add_argument("--db", default="sqlite,postgresql")
        parser.add_argument("--commits", type=int, default=40)
        parser.add_argument("--code", help="run the API process on this checkout's code")
        asyncio.run(main(parser.parse_args()))
