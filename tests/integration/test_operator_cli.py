"""`promptjobs jobs …` and `promptjobs status` against a SQLite file and the real dev server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from activities.adapters.fake import fake_output
from projections.domain.lifecycle import EventType
from projections.scope import Scope
from promptjobs.cli import app
from promptjobs.wiring import open_projection
from tests.conftest import (
    Stack,
    cli,
    cli_env,
    cli_json,
    eventually,
    free_port,
    make_settings,
    running_stack,
)

SLOW = {"fake": {"latency_ms": 20_000}}


@pytest.fixture
async def sqlite_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    settings = make_settings(tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}")
    async with running_stack(settings, dev_server.client) as stack:
        yield stack


async def _globex_job(stack: Stack, **body: Any) -> str:
    async with stack.as_user(await stack.key("globex", "gus")) as globex:
        response = await globex.post("/v1/prompts", json={"prompt": "from globex", **body})
    assert response.status_code == 202
    job_id: str = response.json()["job_id"]
    return job_id


async def test_list_and_show_see_every_org(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    acme = (await stack.submit("from acme"))["job_id"]
    globex = await _globex_job(stack, max_attempts=1, options={"fake": {"fail": ["auth"]}})
    await stack.settled(acme)
    await eventually(
        lambda: cli_json(stack, "jobs", "show", globex),
        lambda shown: shown["job"]["state"] == "failed",
    )

    listed = await cli_json(stack, "jobs", "list")
    assert {job["job_id"]: job["org"] for job in listed["jobs"]} == {
        acme: "acme",
        globex: "globex",
    }
    only_failed = await cli_json(stack, "jobs", "list", "--state", "failed", "--org", "globex")
    assert [job["job_id"] for job in only_failed["jobs"]] == [globex]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert (await cli_json(stack, "jobs", "list", "--since", future))["jobs"] == []
    assert (
        len((await cli_json(stack, "jobs", "list", "--since", "1h", "--limit", "1"))["jobs"]) == 1
    )

    human = (await cli(stack, "jobs", "list")).output
    assert acme in human and globex in human and "globex" in human

    shown = await cli_json(stack, "jobs", "show", globex)
    assert shown["job"]["error_kind"] == "auth"
    assert [event["state"] for event in shown["events"]] == ["queued", "running", "failed"]
    assert shown["prompt_jobs"] == []
    assert (shown["prompt"]["text"], shown["answer"]) == ("from globex", None)
    human = (await cli(stack, "jobs", "show", globex)).output
    assert "auth" in human and "events" in human and "from globex" in human
    assert "other jobs of prompt" not in human  # none: no empty table

    # A succeeded job shows what it was asked and what it answered, and its attempts.
    shown = await cli_json(stack, "jobs", "show", acme)
    assert shown["answer"]["text"] == fake_output("from acme")
    assert [a["outcome"] for a in shown["attempts"]] == ["succeeded"]
    human = (await cli(stack, "jobs", "show", acme)).output
    assert fake_output("from acme") in human and "attempts" in human


async def test_cancel_and_retry_act_through_temporal(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    job_id = (await stack.submit("long", options=SLOW))["job_id"]
    await eventually(lambda: stack.job(job_id), lambda j: j["state"] == "running")

    cancelled = await cli_json(stack, "jobs", "cancel", job_id)
    assert cancelled["job_id"] == job_id
    assert (await stack.settled(job_id))["state"] == "cancelled"

    retried = await cli_json(stack, "jobs", "retry", job_id)
    new_id = retried["job_id"]
    assert retried["supersedes"] == job_id and retried["state"] == "queued"
    # The command returned only once Temporal had the new job's workflow.
    assert (await stack.client.get_workflow_handle(new_id).describe()).id == new_id
    assert (await stack.job(job_id))["superseded_by"] == new_id

    shown = await cli_json(stack, "jobs", "show", new_id)
    assert [job["job_id"] for job in shown["prompt_jobs"]] == [job_id]
    await cli(stack, "jobs", "cancel", new_id)
    assert (await stack.settled(new_id))["state"] == "cancelled"
    human = (await cli(stack, "jobs", "retry", new_id)).output
    assert f"supersedes {new_id}" in human

    refused = await asyncio.to_thread(
        CliRunner().invoke, app, ["jobs", "cancel", job_id], env=cli_env(stack)
    )
    assert refused.exit_code != 0
    assert "superseded" in str(refused.exception)

    # A misspelt option is named as the API names it, with the field it likely meant.
    misspelt = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["jobs", "retry", new_id, "--options", '{"temprature": 0.5}'],
        env=cli_env(stack),
    )
    assert misspelt.exit_code != 0
    assert "did you mean `temperature`?" in str(misspelt.exception)


async def test_cancel_while_temporal_is_unreachable_says_so_in_one_line(
    sqlite_stack: Stack,
) -> None:
    stack = sqlite_stack
    job_id = (await stack.submit("long", options=SLOW))["job_id"]
    await eventually(lambda: stack.job(job_id), lambda j: j["state"] == "running")
    env = {**os.environ, **cli_env(stack, PROMPTJOBS_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "promptjobs", "jobs", "cancel", job_id,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _out, err = await asyncio.wait_for(process.communicate(), 60)
    lines = err.decode().strip().splitlines()
    assert process.returncode == 1
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert (
        lines[0].startswith(f"error: cancel of {job_id} is recorded") and "unreachable" in lines[0]
    )
    # The request is on the row: the API's dispatcher delivers it.
    assert (await stack.settled(job_id))["state"] == "cancelled"


async def test_retry_can_change_options_priority_and_attempts(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    failing = {"fake": {"latency_ms": 5, "fail": ["provider_5xx"]}}
    job_id = (await stack.submit("weak", max_attempts=1, options=failing))["job_id"]
    assert (await stack.settled(job_id))["state"] == "failed"
    healthy = '{"fake": {"latency_ms": 5}}'
    refused = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["jobs", "retry", job_id, "--priority", "101", "--options", healthy],
        env=cli_env(stack),
    )
    assert refused.exit_code != 0 and "priority" in str(refused.exception)
    assert (await stack.job(job_id))["state"] == "failed"

    args = ["jobs", "retry", job_id, "--options", healthy, "--priority", "7"]
    retried = await cli_json(stack, *args, "--max-attempts", "2")
    assert retried["options"] == {"fake": {"latency_ms": 5}}
    assert (retried["priority"], retried["max_attempts"]) == (7, 2)
    assert (await stack.settled(retried["job_id"]))["state"] == "succeeded"


async def test_metrics_per_org(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    ok = [(await stack.submit(f"p{i}"))["job_id"] for i in range(3)]
    bad = await _globex_job(stack, max_attempts=1, options={"fake": {"fail": ["auth"]}})
    for job_id in ok:
        await stack.settled(job_id)
    await eventually(
        lambda: cli_json(stack, "jobs", "show", bad), lambda s: s["job"]["state"] == "failed"
    )

    orgs = {m["org"]: m for m in (await cli_json(stack, "jobs", "metrics"))["orgs"]}
    assert set(orgs) == {"acme", "globex", "*"}
    assert orgs["acme"]["states"]["succeeded"] == 3
    assert orgs["globex"]["states"]["failed"] == 1
    assert orgs["globex"]["error_kinds"] == {"auth": 1}
    assert orgs["*"]["states"]["succeeded"] == 3 and orgs["*"]["states"]["failed"] == 1
    for latency in ("wait_s", "run_s"):
        p50, p99 = orgs["acme"][latency]["p50"], orgs["acme"][latency]["p99"]
        assert p50 is not None and p99 is not None and 0 <= p50 <= p99
        mean = orgs["acme"][latency]["mean"]
        assert mean is not None and 0 <= mean <= p99
    # failed / settled in the window: none of acme's three, globex's only one.
    assert orgs["acme"]["error_rate"] == 0.0
    assert orgs["globex"]["error_rate"] == 1.0
    assert orgs["*"]["error_rate"] == 0.25
    only = (await cli_json(stack, "jobs", "metrics", "--org", "globex"))["orgs"]
    assert {m["org"] for m in only} == {"globex", "*"}

    # Tokens and cost per org and model: every attempt counts, the failed one too.
    usage = (await cli_json(stack, "jobs", "metrics"))["usage"]
    by = {(u["org"], u["model"]): u for u in usage}
    assert set(by) == {("acme", "fake-1"), ("acme", "*"), ("globex", "fake-1"), ("globex", "*")}
    acme = by[("acme", "fake-1")]
    assert (acme["attempts"], acme["input_tokens"], acme["cost_usd"], acme["unpriced"]) == (
        3,
        3,
        0.0,
        0,
    )
    assert acme["output_tokens"] == 3 * len(fake_output("p0").split())
    assert by[("globex", "*")]["attempts"] == 1
    assert by[("globex", "fake-1")]["output_tokens"] == 0  # refused before any text

    human = (await cli(stack, "jobs", "metrics")).output
    assert "auth" in human and "wait p50" in human and "globex" in human
    assert "wait mean" in human and "error rate" in human and "100.0%" in human
    assert "usage by model" in human and "fake-1" in human


async def test_archive_removes_old_settled_jobs_and_their_orphaned_prompts(
    sqlite_stack: Stack,
) -> None:
    stack = sqlite_stack
    done = (await stack.submit("done"))["job_id"]
    finished = await stack.settled(done)
    retried = (await stack.submit("retried"))["job_id"]
    await stack.settled(retried)
    replacement = (await stack.http.post(f"/v1/jobs/{retried}/retry")).json()["job_id"]
    await stack.settled(replacement)
    live = (await stack.submit("live", options=SLOW))["job_id"]
    await eventually(lambda: stack.job(live), lambda j: j["state"] == "running")

    cutoff = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    dry = await cli_json(stack, "jobs", "archive", "--before", cutoff, "--dry-run")
    # done (+prompt, +response), retried and its replacement (+prompt, +2 responses).
    assert (dry["jobs"], dry["prompts"], dry["responses"], dry["dry_run"]) == (3, 2, 3, True)
    # Every event of the three: their transitions and the text they streamed.
    logged = [
        await stack.projection.store.job_events(Scope.operator(), job_id, kinds=tuple(EventType))
        for job_id in (done, retried, replacement)
    ]
    assert [sum(e.type == EventType.STATE_CHANGED for e in log) for log in logged] == [3, 4, 3]
    assert dry["events"] == sum(len(log) for log in logged)
    assert (await stack.job(done))["state"] == "succeeded"

    # Two jobs a transaction: three batches (the last one short), each shown as it lands.
    archived = await cli(
        stack, "jobs", "archive", "--before", cutoff, PROMPTJOBS_RETENTION_BATCH="2"
    )
    assert archived.stdout.startswith(
        f"removed 3 jobs, {dry['events']} events, 2 prompts and 3 responses"
    )
    assert archived.stderr.splitlines() == [
        "… 2 jobs removed so far",
        "… 3 jobs removed so far",
    ]
    for gone in (done, retried, replacement):
        assert (await stack.http.get(f"/v1/jobs/{gone}")).status_code == 404
    assert (await stack.http.get(f"/v1/responses/{finished['response_id']}")).status_code == 404
    assert (await stack.job(live))["state"] == "running"
    again = await cli_json(stack, "jobs", "archive", "--before", cutoff)
    assert (again["jobs"], again["prompts"]) == (0, 0)
    await stack.http.post(f"/v1/jobs/{live}/cancel")
    await stack.settled(live)


async def test_status_shows_jobs_workers_and_pollers(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    await stack.settled((await stack.submit("one"))["job_id"])

    status = await cli_json(stack, "status")
    assert status["projection"]["states"]["succeeded"] == 1
    assert status["projection"]["last_transition_at"] is not None
    (worker,) = status["projection"]["workers"]
    assert worker["succeeded"] == 1 and str(os.getpid()) in worker["worker"]
    kinds = {poller["kind"] for poller in status["temporal"]["pollers"]}
    assert kinds == {"workflow", "activity"}
    assert all(p["last_access_time"] for p in status["temporal"]["pollers"])

    human = (await cli(stack, "status")).output
    assert "pollers on task queue" in human and worker["worker"] in human


async def test_workflow_of_cancelled_job_is_closed(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    job_id = (await stack.submit("long", options=SLOW))["job_id"]
    await eventually(lambda: stack.job(job_id), lambda j: j["state"] == "running")
    await cli(stack, "jobs", "cancel", job_id)
    described = await eventually(
        lambda: stack.client.get_workflow_handle(job_id).describe(),
        lambda d: d.status is WorkflowExecutionStatus.CANCELED,
    )
    assert described.status is WorkflowExecutionStatus.CANCELED


async def test_tables_fit_an_80_column_terminal_and_never_wrap_an_id(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    options = {"fake": {"fail": ["provider_5xx"], "latency_ms": 10}, "temperature": 0.5}
    flaky = (await stack.submit("flaky once", options=options))["job_id"]
    await stack.settled(flaky, timeout=30)
    narrow = {"COLUMNS": "80"}

    listed = (await cli(stack, "jobs", "list", **narrow)).stdout
    assert any(flaky in line for line in listed.splitlines()), listed
    assert max(len(line) for line in listed.splitlines()) <= 80, listed

    shown = (await cli(stack, "jobs", "show", flaky, **narrow)).stdout
    assert any(flaky in line for line in shown.splitlines()), shown
    # Options as JSON, which `jobs retry --options` takes back as it is.
    [options_line] = [line for line in shown.splitlines() if line.startswith("options ")]
    assert json.loads(options_line.removeprefix("options ")) == options
    # Attempt 2's running row is not attempt 1's failure: the error shows on the re-queue.
    running = [line for line in shown.splitlines() if " running " in line]
    assert len(running) == 2 and not any("provider_5xx" in line for line in running), shown
    assert any("provider_5xx" in line and " queued " in line for line in shown.splitlines())

    metrics = (await cli(stack, "jobs", "metrics", **narrow)).stdout.splitlines()
    assert "latency (s) and error rate (failed / settled)" in metrics
    # The re-queue's provider_5xx counts, though the job then succeeded.
    kinds = (await cli_json(stack, "jobs", "metrics"))["orgs"]
    assert {m["org"]: m["error_kinds"] for m in kinds}["acme"] == {"provider_5xx": 1}


async def test_status_says_when_it_reads_devs_store_but_another_temporal_and_fails_unreachable(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path)
    async with open_projection(settings):
        pass  # `./run dev`'s store, in its data directory
    dev_address = dev_server.client.service_client.config.target_host
    (tmp_path / "env").write_text(f"export PROMPTJOBS_TEMPORAL_ADDRESS={dev_address}\n")

    def status(address: str) -> Any:
        env = {"PROMPTJOBS_DATA_DIR": str(tmp_path), "PROMPTJOBS_TEMPORAL_ADDRESS": address}
        return CliRunner().invoke(app, ["status"], env=env)

    # A shell that did not `source .data/env`: the default address, where nothing listens.
    elsewhere = await asyncio.to_thread(status, f"127.0.0.1:{free_port()}")
    assert elsewhere.exit_code == 1, elsewhere.output
    assert f"whose Temporal is at {dev_address}" in elsewhere.output
    assert f"source {tmp_path / 'env'}" in elsewhere.output
    assert "unreachable" in elsewhere.output
    # After `source .data/env`: no warning, and Temporal answers.
    sourced = await asyncio.to_thread(status, dev_address)
    assert sourced.exit_code == 0, sourced.output
    assert "warning" not in sourced.output


def test_help_shows_a_flag_without_a_value_type() -> None:
    # Flags take no value: their help must not suggest one (`--json <bool>`).
    for command in ([], ["jobs", "list"], ["dev"], ["keys", "create"]):
        shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "100"})
        assert shown.exit_code == 0, shown.output
        assert "<bool>" not in shown.output and "--help" in shown.output, shown.output
