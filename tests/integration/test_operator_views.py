"""What operators see outside the CLI: Temporal visibility queries and Prometheus /metrics."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event
from temporalio.testing import WorkflowEnvironment

from promptjobs.runtime import temporal_cli
from tests.conftest import Stack, eventually, make_settings, running_stack

# A provider failure that ends a one-attempt job (a 429 no longer does: it costs no attempt).
FAIL_5XX = {"fake": {"fail": ["provider_5xx"]}}


async def test_failed_jobs_of_one_org_and_error_kind_are_one_visibility_query(stack: Stack) -> None:
    failed = await stack.submit("limited", max_attempts=1, options=FAIL_5XX)
    succeeded = await stack.submit("fine")
    async with stack.as_user(await stack.key("globex", "gus")) as globex:
        other = (
            await globex.post(
                "/v1/prompts",
                json={"prompt": "limited", "max_attempts": 1, "options": FAIL_5XX},
            )
        ).json()
    for job_id in (failed["job_id"], succeeded["job_id"]):
        await stack.settled(job_id)

    query = (
        'PromptJobOrg="acme" AND PromptJobState="failed" AND PromptJobErrorKind="provider_5xx"'
        f' AND TaskQueue="{stack.settings.temporal_task_queue}"'
    )

    async def found() -> list[str]:
        return [wf.id async for wf in stack.client.list_workflows(query)]

    ids = await eventually(found, lambda ids: ids == [failed["job_id"]], timeout=30)
    assert other["job_id"] not in ids


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _scrape(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        response = await anonymous.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return _samples(response.text)


async def test_metrics_count_submissions_transitions_adapter_calls_and_queue_depth(
    stack: Stack,
) -> None:
    before = await _scrape(stack)
    ok = await stack.submit("fine")
    bad = await stack.submit("limited", max_attempts=1, options=FAIL_5XX)
    later = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    waiting = await stack.submit("later", scheduled_for=later)
    for job_id in (ok["job_id"], bad["job_id"]):
        await stack.settled(job_id)

    after = await _scrape(stack)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("promptjobs_submissions_total", org="") == 3
    assert delta("promptjobs_job_transitions_total", state="queued", error_kind="") == 3
    assert delta("promptjobs_job_transitions_total", state="running", error_kind="") == 2
    assert delta("promptjobs_job_transitions_total", state="succeeded", error_kind="") == 1
    assert delta("promptjobs_job_transitions_total", state="failed", error_kind="provider_5xx") == 1
    calls = "promptjobs_adapter_call_seconds_count"
    assert delta(calls, provider="fake", outcome="ok") == 1
    assert delta(calls, provider="fake", outcome="provider_5xx") == 1
    assert after[("promptjobs_jobs", (("state", "queued"),))] == 1  # the scheduled one
    assert after[("promptjobs_jobs", (("state", "running"),))] == 0

    await stack.http.post(f"/v1/jobs/{waiting['job_id']}/cancel")
    await stack.settled(waiting["job_id"])
    cancelled = await _scrape(stack)
    assert cancelled[("promptjobs_jobs", (("state", "queued"),))] == 0


async def test_an_open_metrics_endpoint_names_no_org(stack: Stack) -> None:
    async with stack.as_user(await stack.key("globex-secret-customer", "gus")) as globex:
        assert (await globex.post("/v1/prompts", json={"prompt": "x"})).status_code == 202
    await stack.submit("y")
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        text = (await anonymous.get("/metrics")).text
    assert "promptjobs_submissions_total" in text
    assert "globex-secret-customer" not in text and "acme" not in text


async def test_metrics_take_the_operator_token_when_one_is_set_and_may_name_orgs(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, metrics_token="s3cret", metrics_org_labels=True)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        await stack.submit("counted")
        async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
            refused = await anonymous.get("/metrics")
            wrong = await anonymous.get("/metrics", headers={"Authorization": "Bearer nope"})
            # An API key is not the operator's token.
            as_member = await stack.http.get("/metrics")
            allowed = await anonymous.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    for response in (refused, wrong, as_member):
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/problem+json"
        assert "PROMPTJOBS_METRICS_TOKEN" in response.json()["detail"]
    assert allowed.status_code == 200
    assert _samples(allowed.text)[("promptjobs_submissions_total", (("org", "acme"),))] >= 1


async def test_frequent_scrapes_count_the_jobs_table_once_per_cache_interval(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, metrics_cache_s=60)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        counts: list[str] = []

        def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if "count(" in statement.lower() and "GROUP BY jobs.state" in statement:
                counts.append(statement)

        engine = stack.projection.engine.sync_engine
        event.listen(engine, "before_cursor_execute", seen)
        try:
            async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
                for _ in range(10):
                    assert (await anonymous.get("/metrics")).status_code == 200
        finally:
            event.remove(engine, "before_cursor_execute", seen)
    assert len(counts) == 1


async def test_three_jobs_show_one_completed_one_failed_one_canceled_in_temporal(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Issue 20's operator view: a failed job is a Failed workflow, as Temporal counts it.
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'projection.db'}",
        backoff_initial_s=1.0,
        backoff_jitter=0.0,
    )
    async with running_stack(settings, dev_server.client) as stack:
        retried = await stack.submit("flaky", options={"fake": {"fail": ["provider_5xx"]}})
        refused = await stack.submit("no key", options={"fake": {"fail": ["auth"]}})
        slow = await stack.submit("slow", options={"fake": {"latency_ms": 20_000}})
        await eventually(lambda: stack.job(slow["job_id"]), lambda j: j["state"] == "running")
        assert (await stack.http.post(f"/v1/jobs/{slow['job_id']}/cancel")).status_code == 202
        settled = {j: (await stack.settled(j))["state"] for j in _ids(retried, refused, slow)}
        assert list(settled.values()) == ["succeeded", "failed", "cancelled"]
        assert (await stack.job(retried["job_id"]))["attempt"] == 2

        queue = f'TaskQueue="{settings.temporal_task_queue}"'
        listed = await eventually(
            lambda: _temporal_list(dev_server, queue),
            lambda rows: sorted(rows.values()) == ["Canceled", "Completed", "Failed"],
            timeout=30,
        )
        assert listed == {
            retried["job_id"]: "Completed",
            refused["job_id"]: "Failed",
            slow["job_id"]: "Canceled",
        }
        failed = await _temporal_list(dev_server, f'{queue} AND ExecutionStatus="Failed"')
        assert list(failed) == [refused["job_id"]]


def _ids(*accepted: dict[str, Any]) -> list[str]:
    return [str(a["job_id"]) for a in accepted]


async def _temporal_list(env: WorkflowEnvironment, query: str) -> dict[str, str]:
    """`temporal workflow list --query …` as an operator runs it: workflow id → status."""
    done = await asyncio.create_subprocess_exec(
        temporal_cli(), "workflow", "list",
        "--address", env.client.service_client.config.target_host,
        "--query", query, "--output", "json",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await done.communicate()
    assert done.returncode == 0
    rows = json.loads(out or b"[]")
    prefix = "WORKFLOW_EXECUTION_STATUS_"
    return {
        row["execution"]["workflowId"]: str(row["status"]).removeprefix(prefix).title()
        for row in rows
    }
