"""A separately run `promptjobs worker`: its Prometheus port (our counters and the Temporal
SDK's), and what `promptjobs status` says about it (heartbeat, configuration)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from promptjobs.cli import app
from promptjobs.observability import SDK_WORKER_METRICS
from tests.conftest import eventually, free_port, make_settings, running_stack
from tests.integration.processes import process_env, promptjobs_process, temporal_address

# The Temporal SDK's own worker metrics an operator watches (slots, poll, schedule-to-start).
SDK_METRICS = set(SDK_WORKER_METRICS)


def metric_names(text: str) -> dict[str, list[Any]]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


async def status_json(env: dict[str, str]) -> dict[str, Any]:
    result = await asyncio.to_thread(CliRunner().invoke, app, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    status: dict[str, Any] = json.loads(result.output)
    return status


async def test_a_worker_serves_our_counters_and_the_sdks_metrics_and_reports_itself(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        temporal_address=temporal_address(dev_server),
    )
    port = free_port()
    env = process_env(
        settings, worker_metrics_port=port, metrics_token="scrape-me", worker_heartbeat_s=0.5
    )
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        with promptjobs_process("worker", env, tmp_path / "worker") as worker:
            await worker.ready()
            job = await stack.submit("counted by the worker")
            assert (await stack.settled(job["job_id"]))["state"] == "succeeded"

            url = f"http://127.0.0.1:{port}/metrics"
            async with httpx.AsyncClient(timeout=10) as http:
                assert (await http.get(url)).status_code == 401
                scraped = await http.get(url, headers={"Authorization": "Bearer scrape-me"})
            assert scraped.status_code == 200
            metrics = metric_names(scraped.text)
            calls = {
                (s.labels["provider"], s.labels["outcome"]): s.value
                for s in metrics["promptjobs_adapter_call_seconds"]
                if s.name.endswith("_count")
            }
            assert calls[("fake", "ok")] == 1
            transitions = {
                s.labels["state"]: s.value
                for s in metrics["promptjobs_job_transitions"]
                if s.name.endswith("_total")
            }
            assert transitions["running"] == 1 and transitions["succeeded"] == 1
            missing = SDK_METRICS - set(metrics)
            assert not missing, f"no {missing} in:\n{scraped.text[:3000]}"
            # The labels the dashboard groups by.
            assert all(
                "worker_type" in s.labels for s in metrics["temporal_worker_task_slots_used"]
            )
            assert all("poller_type" in s.labels for s in metrics["temporal_num_pollers"])

            cli_env = {
                "PROMPTJOBS_DATABASE_URL": settings.projection_url,
                "PROMPTJOBS_TEMPORAL_ADDRESS": settings.temporal_address,
                "PROMPTJOBS_TEMPORAL_TASK_QUEUE": settings.temporal_task_queue,
                "PROMPTJOBS_DATA_DIR": str(settings.data_dir),
                "PROMPTJOBS_WORKER_HEARTBEAT_S": "0.5",
            }
            # The worker records itself as it starts, beside its polling: under a loaded machine
            # that write may land a moment after the worker says it is ready.
            status = await eventually(
                lambda: status_json(cli_env),
                lambda s: any(w["config"]["pid"] == worker.pid for w in s["registered_workers"]),
            )
            (registered,) = [
                w for w in status["registered_workers"] if w["config"]["pid"] == worker.pid
            ]
            assert registered["status"] == "alive" and registered["heartbeat_at"]
            assert registered["config"]["task_queue"] == settings.temporal_task_queue
            assert registered["config"]["metrics_port"] == port
            assert registered["config"]["max_concurrent_activities"] == 1000
            assert "scrape-me" not in json.dumps(status)
            first_beat = registered["heartbeat_at"]
            later = await eventually(
                lambda: status_json(cli_env),
                lambda s: any(
                    w["config"]["pid"] == worker.pid and w["heartbeat_at"] != first_beat
                    for w in s["registered_workers"]
                ),
            )
            assert later

            worker.terminate()
            assert await worker.exited() == 0
            stopped = await status_json(cli_env)
            (gone,) = [w for w in stopped["registered_workers"] if w["config"]["pid"] == worker.pid]
            assert gone["status"] == "stopped"
            human = await asyncio.to_thread(CliRunner().invoke, app, ["status"], env=cli_env)
            assert "worker processes" in human.output and "stopped" in human.output
