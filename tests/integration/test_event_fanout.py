"""GET /v1/events at scale, over real HTTP on SQLite and PostgreSQL: one log reader per API
process fans events out; resumes join the live feed without gap or duplicate; streams are
bounded (per key, per process, in buffer and lifetime) and end when their key is revoked."""

from __future__ import annotations

import asyncio
import random
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event, update
from temporalio.testing import WorkflowEnvironment

from projections.event_log import append_event, utcnow
from projections.group_commit import WriteTx
from projections.models import ApiKey
from projections.projector import current
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import open_projection
from tests.conftest import Stack, eventually, make_settings, running_stack
from tests.integration.event_stream import read_events
from tests.integration.sse import Stream, sse

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")
LATER = datetime.now(UTC) + timedelta(days=1)


def later(text: str) -> Submission:
    """A submission that stays queued: one event each, nothing for the worker to do."""
    return Submission(text=text, priority=50, max_attempts=1, options={}, scheduled_for=LATER)


@asynccontextmanager
async def stack_with(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path, **settings: Any
) -> AsyncIterator[Stack]:
    config = make_settings(tmp_path, database_url=database_url, **settings)
    async with running_stack(config, dev_server.client, run_worker=False) as stack:
        yield stack


async def logged_ids(stack: Stack, scope: Scope, since: int) -> list[int]:
    """The truth: the caller's events after `since`, straight from the log."""
    events = await stack.projection.store.events_since(scope, since, 100_000)
    return [e.id for e in events]


async def test_resumes_join_the_live_feed_without_gap_or_duplicate_under_concurrent_commits(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    async with (
        stack_with(dev_server, database_url, tmp_path) as stack,
        # Commits the API's process is not told of, as a worker process's are: they reach
        # its reader through LISTEN/NOTIFY (PostgreSQL) or its poll (SQLite).
        open_projection(stack.settings, run_migrations=False) as elsewhere,
    ):
        cursors = [await stack.projection.store.latest_event_id()]
        done = asyncio.Event()

        async def commit() -> None:
            rng = random.Random(21)
            for i in range(160):
                store = stack.projection.store if i % 2 else elsewhere.store
                accepted = await store.submit(ALICE, later(f"seam {i}"))
                cursors.append(accepted.job.last_event_id)
                await asyncio.sleep(rng.random() * 0.01)
            done.set()

        async def resume(delay: float) -> tuple[int, list[int]]:
            # Connect mid-burst with a cursor from a little earlier: its backlog comes from
            # the log while new commits arrive through the live feed.
            await asyncio.sleep(delay)
            since = cursors[max(0, len(cursors) - 20)]
            async with sse(stack.http, since=str(since)) as stream:
                await done.wait()
                final = (await logged_ids(stack, ALICE, 0))[-1]
                await stream.until(
                    lambda s: bool(s.events) and int(s.events[-1]["id"]) >= final, timeout=60
                )
                return since, [int(e["id"]) for e in stream.events]

        writer = asyncio.create_task(commit())
        streams = await asyncio.gather(*(resume(0.05 * n) for n in range(12)))
        await writer

        for since, ids in streams:
            assert ids == await logged_ids(stack, ALICE, since)


async def test_each_stream_sees_exactly_its_scope(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    async with stack_with(dev_server, database_url, tmp_path) as stack:
        store = stack.projection.store
        scopes = {
            "alice": ALICE,
            "bob": Scope("acme", "bob", "member"),
            "carol": Scope("acme", "carol", "admin"),
            "gina": Scope("globex", "gina", "admin"),
        }
        keys = {name: await stack.key(s.org, s.user, s.role) for name, s in scopes.items()}
        since = await store.latest_event_id()
        first = await store.submit(ALICE, later("alice's first"))
        clients = {name: stack.as_user(key) for name, key in keys.items()}
        try:
            async with (
                sse(clients["alice"], since=str(since)) as alice,
                sse(clients["bob"], since=str(since)) as bob,
                sse(clients["carol"], since=str(since)) as carol,
                sse(clients["gina"], since=str(since)) as gina,
                sse(clients["carol"], since=str(since), job_id=first.job.job_id) as one_job,
                sse(clients["alice"], since=str(since), prompt_id=first.prompt.prompt_id) as one,
            ):
                for i in range(5):
                    for name in ("alice", "bob", "gina"):
                        await store.submit(scopes[name], later(f"{name} {i}"))

                async def ids_of(stream: Stream, expected: list[int]) -> list[int]:
                    await stream.until(lambda s: len(s.events) >= len(expected))
                    return [int(e["id"]) for e in stream.events]

                for name, stream in (
                    ("alice", alice),
                    ("bob", bob),
                    ("carol", carol),
                    ("gina", gina),
                ):
                    expected = await logged_ids(stack, scopes[name], since)
                    assert await ids_of(stream, expected) == expected, name
                own = await store.events_since(ALICE, since, 1000, job_id=first.job.job_id)
                expected = [e.id for e in own]
                assert len(expected) == 1
                assert await ids_of(one_job, expected) == expected
                mine = await store.events_since(
                    ALICE, since, 1000, prompt_id=first.prompt.prompt_id
                )
                expected = [e.id for e in mine]
                assert await ids_of(one, expected) == expected
        finally:
            for client in clients.values():
                await client.aclose()


async def test_a_commit_costs_the_same_sql_however_many_streams_are_open(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    # No poll, no key check during the test: every statement is the commit's or its wake-up's.
    async with stack_with(
        dev_server, database_url, tmp_path, sse_poll_interval_s=60, sse_key_check_s=60
    ) as stack:
        globex = stack.as_user(await stack.key("globex", "gina", "admin"))
        statements: list[str] = []

        def count(*args: Any) -> None:
            # The streams' side: reads of the log (the dispatcher's scans are not theirs).
            if "FROM job_events" in str(args[2]):
                statements.append(str(args[2]))

        async def commit_and_count() -> int:
            statements.clear()
            await stack.projection.store.submit(ALICE, later("counted"))
            await asyncio.sleep(0.5)  # let every woken stream do whatever it does
            return len(statements)

        sync_engine = stack.projection.engine.sync_engine
        event.listen(sync_engine, "before_cursor_execute", count)
        try:
            async with sse(stack.http):
                with_one = await commit_and_count()
                async with (
                    sse(globex),
                    sse(globex),
                    sse(globex),
                    sse(stack.http),
                    sse(stack.http),
                    sse(stack.http),
                    sse(globex),
                    sse(globex),
                ):
                    with_nine = await commit_and_count()
        finally:
            event.remove(sync_engine, "before_cursor_execute", count)
            await globex.aclose()
        # One read of the log per commit, whatever the number of streams (give or take a
        # second wake-up by NOTIFY on PostgreSQL, and a read that found the commit not final
        # yet while another transaction was in flight); each stream querying would add eight.
        assert with_one <= 3, statements
        assert with_nine - with_one <= 1, statements


async def test_streams_past_a_bound_get_429_with_retry_after(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    async with stack_with(
        dev_server, database_url, tmp_path, sse_max_streams_per_key=2, sse_max_streams=3
    ) as stack:
        bob = stack.as_user(await stack.key("acme", "bob"))
        carol = stack.as_user(await stack.key("acme", "carol"))
        try:
            async with sse(stack.http), sse(stack.http):
                per_key = await stack.http.get("/v1/events")
                assert per_key.status_code == 429, per_key.text
                assert per_key.headers["content-type"] == "application/problem+json"
                assert int(per_key.headers["retry-after"]) > 0
                assert "API key" in per_key.json()["detail"]
                async with sse(bob):
                    per_process = await carol.get("/v1/events")
                    assert per_process.status_code == 429, per_process.text
                    assert "process" in per_process.json()["detail"]

            async def status() -> int:
                async with carol.stream("GET", "/v1/events") as response:
                    return response.status_code

            # Closed streams give their slots back.
            await eventually(status, lambda code: code == 200)
        finally:
            await bob.aclose()
            await carol.aclose()


async def test_a_stream_ends_after_its_lifetime_and_resumes_without_loss(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    async with stack_with(dev_server, database_url, tmp_path, sse_max_lifetime_s=1.5) as stack:
        store = stack.projection.store
        since = await store.latest_event_id()
        async with sse(stack.http, since=str(since)) as stream:
            first = await store.submit(ALICE, later("before the end"))
            await stream.until(lambda s: s.ended, timeout=10)
            assert stream.reader is not None and stream.reader.exception() is None
        second = await store.submit(ALICE, later("after the end"))
        resumed = await read_events(
            stack.http,
            lambda events: events[-1].job_id == second.job.job_id,
            headers={"Last-Event-ID": stream.events[-1]["id"]},
        )
        seen = [int(e["id"]) for e in stream.events] + [e.id for e in resumed]
        assert seen == await logged_ids(stack, ALICE, since)
        assert first.job.job_id in {e["data"]["job_id"] for e in stream.events}


async def test_revoking_a_key_ends_its_open_streams_within_seconds(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    # No key cache here: the last request must see the revocation at once.
    async with stack_with(
        dev_server, database_url, tmp_path, sse_key_check_s=0.5, api_key_cache_ttl_s=0
    ) as stack:
        issued = await stack.projection.store.keys.create("acme", "bob", "admin")
        bob = stack.as_user(issued.secret)
        try:
            async with sse(bob) as revoked, sse(stack.http) as kept:
                async with stack.projection.sessions.begin() as session:
                    await session.execute(
                        update(ApiKey)
                        .where(ApiKey.key_id == issued.key_id)
                        .values(revoked_at=datetime.now(UTC))
                    )
                await revoked.until(lambda s: s.ended, timeout=5)
                after = await stack.projection.store.submit(ALICE, later("after revocation"))
                await kept.until(lambda s: bool(s.states_of(after.job.job_id)))
                assert not kept.ended
                assert after.job.job_id not in {e["data"]["job_id"] for e in revoked.events}
            refused = await bob.get("/v1/events")
            assert refused.status_code == 401
        finally:
            await bob.aclose()


async def test_stream_404_names_the_prompt_when_the_job_is_yours_but_the_prompt_is_not(
    stack: Stack,
) -> None:
    job = await stack.submit("mine", scheduled_for=LATER.isoformat())
    response = await stack.http.get(
        "/v1/events", params={"job_id": job["job_id"], "prompt_id": "p_nobody"}
    )
    assert response.status_code == 404
    assert "prompt 'p_nobody'" in response.json()["detail"]


# -- a client that stops reading -----------------------------------------------------------

EVENT_ID = re.compile(rb"^id: (\d+)", re.MULTILINE)


class StalledClient:
    """A raw HTTP client with a tiny receive window that reads the headers and then nothing,
    so the server's writes back up as they would for a slow consumer."""

    def __init__(self, base_url: str, token: str) -> None:
        url = httpx.URL(base_url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        self.sock.connect((url.host, url.port or 80))
        self.sock.setblocking(False)
        self.request = (
            f"GET /v1/events HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        self.received = b""

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(self.sock, self.request)
        while b"\r\n\r\n" not in self.received:
            self.received += await loop.sock_recv(self.sock, 256)
        assert self.received.startswith(b"HTTP/1.1 200"), self.received

    async def read_to_end(self) -> list[int]:
        """Everything the server sent, up to the end of the chunked body (a clean end)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(20):
            while not self.received.endswith(b"\r\n0\r\n\r\n"):
                chunk = await loop.sock_recv(self.sock, 65536)
                assert chunk, "connection closed without a clean end of the stream"
                self.received += chunk
        return [int(match) for match in EVENT_ID.findall(self.received)]

    def close(self) -> None:
        self.sock.close()


async def test_a_slow_client_is_ended_cleanly_and_resumes_while_others_keep_up(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    async with stack_with(dev_server, database_url, tmp_path, sse_buffer_events=200) as stack:
        store = stack.projection.store
        feed = stack.projection.feed
        since = await store.latest_event_id()
        slow = StalledClient(stack.base_url, stack.api_key)
        try:
            async with sse(stack.http, since=str(since)) as healthy:
                await slow.open()
                await eventually(lambda: _value(feed.open_streams), lambda n: n == 2)
                # Bursts of one job's events (as a job's streamed output will make them)
                # until the stalled stream is let go: the kernel's socket buffers take ~2 MB
                # before the server's writes to it block.
                job = (await store.submit(ALICE, later("chatty"))).job
                for _ in range(8):
                    last = await burst(stack, job.job_id, 2000)
                    await eventually(lambda: _value(feed.position), lambda p, last=last: p == last)
                    if feed.open_streams == 1:
                        break
                assert feed.open_streams == 1, "the stalled stream was never ended"
                final = await store.latest_event_id()
                await healthy.until(
                    lambda s: bool(s.events) and int(s.events[-1]["id"]) == final, timeout=60
                )
                assert not healthy.ended
                assert [int(e["id"]) for e in healthy.events] == await logged_ids(
                    stack, ALICE, since
                )
            got = await slow.read_to_end()
        finally:
            slow.close()
        assert got and got[-1] < final
        resumed = await read_events(
            stack.http,
            lambda events: events[-1].id == final,
            headers={"Last-Event-ID": str(got[-1])},
            timeout=60,
        )
        slow_since = got[0] - 1
        assert got + [e.id for e in resumed] == [
            i for i in await logged_ids(stack, ALICE, since) if i > slow_since
        ]


async def _value(value: int) -> int:
    return value


async def burst(stack: Stack, job_id: str, count: int) -> int:
    """`count` events of one job appended to the log in one transaction: the last one's id."""

    def write(tx: WriteTx) -> int:
        job = current(tx, job_id)
        assert job is not None
        now = utcnow()
        return max(append_event(tx, job, tx.next_event_id(), now) for _ in range(count))

    last = await stack.projection.projector.writes.run(write)
    stack.projection.feed.notify()
    return last
