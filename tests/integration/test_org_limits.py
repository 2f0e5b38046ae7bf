"""Each org's share of the fleet (issue 22, item 1): at most PROMPTJOBS_ORG_MAX_RUNNING (or
the org's own limit) of its jobs run at once across the workers; the rest wait `queued`, hold
no worker slot, and run as slots free up. One org's burst does not delay another org's job."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from projections.domain.lifecycle import JobState
from projections.models import Job
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.cli import app
from promptjobs.runtime import Projection
from tests.conftest import Stack, cli, eventually, make_settings, parse_time, running_stack

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True


async def cli_output(stack: Stack, *args: str) -> str:
    output: str = (await cli(stack, *args)).output
    return output


async def submit(http: httpx.AsyncClient, prompt: str, latency_ms: int, **body: Any) -> str:
    options = {"fake": {"latency_ms": latency_ms}}
    response = await http.post("/v1/prompts", json={"prompt": prompt, "options": options, **body})
    assert response.status_code == 202, response.text
    job_id: str = response.json()["job_id"]
    return job_id


async def row(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await http.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    return job


async def rows(http: httpx.AsyncClient, job_ids: list[str]) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(row(http, job_id) for job_id in job_ids)))


async def settled(http: httpx.AsyncClient, job_id: str, timeout: float = 30) -> dict[str, Any]:
    return await eventually(
        lambda: row(http, job_id), lambda job: job["finished_at"] is not None, timeout=timeout
    )


def most_at_once(jobs: list[dict[str, Any]]) -> int:
    """The largest number of these jobs that were running at the same moment."""
    edges = sorted(
        edge
        for job in jobs
        if job["started_at"]
        for edge in ((parse_time(job["started_at"]), 1), (parse_time(job["finished_at"]), -1))
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


# ~60 s on two cores beside the rest of the suite, with waits of its own up to 60 s a job.
@pytest.mark.timeout(300)
async def test_one_orgs_slow_burst_does_not_delay_another_orgs_job(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # A worker of 20 slots. Without a limit org A's 200 jobs of 2 min would hold all 20, and
    # org B's job would wait until one of them ended (they are cancelled, below, long before:
    # so long only that none ends first on a loaded machine).
    settings = make_settings(tmp_path, worker_max_concurrent_activities=20, org_max_running=10)
    async with (
        running_stack(settings, dev_server.client) as stack,
        stack.as_user(await stack.key("org-a", "ann", "admin")) as a,
        stack.as_user(await stack.key("org-b", "bob")) as b,
    ):
        burst = [await submit(a, f"a{i}", 120_000) for i in range(200)]
        await eventually(
            lambda: rows(a, burst),
            lambda now: sum(job["state"] == "running" for job in now) == 10,
            timeout=60,
        )
        b_done = await settled(b, await submit(b, "b", 10))
        a_rows = await rows(a, burst)

        assert b_done["state"] == "succeeded" and b_done["attempt"] == 1
        # B's job ran to its end while every one of A's was still running or waiting.
        assert not any(job["finished_at"] for job in a_rows)
        states = [job["state"] for job in a_rows]
        assert (states.count("running"), states.count("queued")) == (10, 190)
        # Waiting spends no attempt.
        assert all(job["attempt"] == 0 for job in a_rows if job["state"] == "queued")
        listed = await eventually(
            lambda: cli_output(stack, "orgs", "list", "--json"),
            lambda out: (
                {"org": "org-a", "running": 10, "waiting": 190}.items()
                <= next(o for o in json.loads(out) if o["org"] == "org-a").items()
            ),
            timeout=60,
            interval=0.5,
        )
        print("orgs list:", listed)

        # A's admin cancels the burst: waiting jobs end without ever starting (a few may take
        # a slot the cancelled running ones freed before their own cancel lands).
        cancels = [a.post(f"/v1/jobs/{job_id}/cancel") for job_id in burst]
        assert {r.status_code for r in await asyncio.gather(*cancels)} == {202}
        ended = [await settled(a, job_id, timeout=60) for job_id in burst]
        assert {job["state"] for job in ended} == {"cancelled"}
        never_started = sum(not job["started_at"] for job in ended)
        print("of A's 200 cancelled jobs", never_started, "never started")
        assert never_started >= 150
        assert most_at_once(ended) == 10


async def test_the_excess_waits_queued_and_runs_as_slots_free_up(
    dev_server: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, database_url=database_url, org_max_running=10)
    async with running_stack(settings, dev_server.client) as stack:
        # The org's own limit, as an operator sets it: 2 (the default stays 10).
        assert "at most 2 jobs" in await cli_output(stack, "orgs", "limit", "acme", "2")
        jobs = [await submit(stack.http, f"p{i}", 400) for i in range(8)]
        waiting = await eventually(
            lambda: rows(stack.http, jobs),
            lambda now: (
                sum(row["state"] == "running" for row in now) == 2
                and sum(row["state"] == "queued" for row in now) == 6
            ),
        )
        assert all(row["attempt"] == 0 for row in waiting if row["state"] == "queued")
        (acme,) = [
            row
            for row in json.loads(await cli_output(stack, "orgs", "list", "--json"))
            if row["org"] == "acme"
        ]
        # Between the running jobs' settling and the next ones' admission it may show fewer
        # (the two started together, so they end together: even none for a moment).
        assert acme["limit"] == 2 and acme["limit_from"] == "org" and acme["running"] <= 2

        done = [await stack.settled(job_id, timeout=60) for job_id in jobs]
        assert [row["state"] for row in done] == ["succeeded"] * 8
        # Waiting spent no attempt; never more than two ran at once, across the whole run.
        assert [row["attempt"] for row in done] == [1] * 8
        assert most_at_once(done) == 2

        # Back to the default: the next burst runs up to ten at once.
        await cli_output(stack, "orgs", "limit", "acme", "--default")
        more = [await submit(stack.http, f"q{i}", 400) for i in range(6)]
        done = [await stack.settled(job_id, timeout=60) for job_id in more]
        assert [row["state"] for row in done] == ["succeeded"] * 6
        assert most_at_once(done) > 2
        # Every org the store knows is listed: acme, with only settled jobs now, and an org
        # that has an API key and nothing else yet.
        await stack.key("initech", "peter")
        listed = json.loads(await cli_output(stack, "orgs", "list", "--json"))
        assert {"acme", "initech"} <= {row["org"] for row in listed}


async def test_the_ceiling_covers_the_wait_for_a_slot(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # One slot, jobs of 1.5 s, a ceiling of 8 s: 12 s of work cannot all be admitted in
    # time, whatever the machine's speed, so some jobs end stuck without ever starting.
    # (Which ones depends on the order their workflows first asked for the slot, not on
    # the order they were submitted in.)
    settings = make_settings(tmp_path, org_max_running=1, job_ceiling_s=8.0)
    async with running_stack(settings, dev_server.client) as stack:
        jobs = [await submit(stack.http, f"p{i}", 1500) for i in range(8)]
        done = [await stack.settled(job_id, timeout=40) for job_id in jobs]
        assert any(job["state"] == "succeeded" for job in done), done
        never_admitted = [
            job
            for job in done
            if (job["state"], job["error_kind"], job["attempt"]) == ("failed", "stuck", 0)
        ]
        assert never_admitted, done
        for job in never_admitted:
            assert "while waiting: org acme has 1 of its 1 jobs running" in job["error_message"]
        assert most_at_once(done) == 1


async def test_an_orgs_limit_is_read_by_every_worker_at_each_admission(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    """An org's own limit of 0 is none at all, whatever the default."""
    settings = make_settings(tmp_path, org_max_running=1)
    async with running_stack(settings, dev_server.client) as stack:
        await stack.projection.store.orgs.set_limit("acme", 0)
        jobs = [await submit(stack.http, f"p{i}", 800) for i in range(4)]
        done = [await stack.settled(job_id, timeout=30) for job_id in jobs]
        assert [row["state"] for row in done] == ["succeeded"] * 4
        assert most_at_once(done) > 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("orgs", "limit", "acme"),
            "give a limit (0 for none), --default, --tpm N or --usd-per-day N",
        ),
        (("orgs", "limit", "acme", "3", "--default"), "give a limit (0 for none) or --default"),
        (("orgs", "limit", "acme", "--", "-1"), "the limit must be 0 or more"),
    ],
)
def test_orgs_limit_refuses_what_it_cannot_set(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    env = {"PROMPTJOBS_DATA_DIR": str(tmp_path)}
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code != 0
    assert message in str(result.exception)


async def test_an_org_full_of_urgent_waiters_does_not_hide_another_orgs_waiter(
    projection: Projection,
) -> None:
    """Org A runs its one slot and has more waiters at priority 0 than one wake-up pass takes;
    org B's waiter at priority 50 has a free slot and is woken on the same pass."""
    store, now = projection.store, datetime.now(UTC)

    async def waiter(org: str, priority: int, admitted: bool = False) -> str:
        job = (await store.submit(Scope(org, "u", "admin"), Submission("w", priority, 3, {}))).job
        values: dict[str, Any] = (
            {"state": JobState.RUNNING, "admitted_at": now}
            if admitted
            else {"awaiting_slot_since": now}
        )
        async with projection.sessions() as session, session.begin():
            await session.execute(update(Job).where(Job.job_id == job.job_id).values(values))
        return job.job_id

    await waiter("org-a", 0, admitted=True)
    crowd = [await waiter("org-a", 0) for _ in range(8)]
    b = await waiter("org-b", 50)

    woken = await projection.store.orgs.slot_waiters(default_limit=1, batch=5)
    assert woken == [b]
    assert not set(woken) & set(crowd)


async def test_by_default_one_org_leaves_room_in_the_fleet_for_the_next(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # A fleet of 20 slots and the default limit (100, more than the fleet): org A's 40 jobs
    # of 20 s (none ends while the test looks, on a slow machine too) take all but a tenth of
    # it, from the first attempt on, so org B's quick job starts at once instead of waiting
    # for one of A's to end (issue 31, item 6).
    settings = make_settings(tmp_path, worker_max_concurrent_activities=20)
    assert settings.org_max_running == 100
    async with (
        running_stack(settings, dev_server.client) as stack,
        stack.as_user(await stack.key("org-a", "ann", "admin")) as a,
        stack.as_user(await stack.key("org-b", "bob")) as b,
    ):
        burst = [await submit(a, f"a{i}", 20_000) for i in range(40)]
        await eventually(
            lambda: rows(a, burst),
            lambda now: sum(job["state"] == "running" for job in now) == 18,
            timeout=60,
        )
        submitted = datetime.now(UTC)
        b_done = await settled(b, await submit(b, "b", 10))
        a_rows = await rows(a, burst)
        assert b_done["state"] == "succeeded"
        assert (parse_time(b_done["started_at"]) - submitted).total_seconds() < 1.5
        assert not any(job["finished_at"] for job in a_rows)
        assert [job["state"] for job in a_rows].count("running") == 18
        cancels = [a.post(f"/v1/jobs/{job_id}/cancel") for job_id in burst]
        assert {r.status_code for r in await asyncio.gather(*cancels)} == {202}
        for job_id in burst:
            await settled(a, job_id, timeout=60)
