"""A job harness on the time-skipping test server: real activities, real SQLite projection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from projections.models import Job, JobEvent
from projections.scope import Scope
from projections.writes import Submission
from promptjobs.runtime import Projection, build_dispatcher, open_projection
from promptjobs.settings import Settings
from services.dispatch import Dispatcher
from tests.conftest import make_settings, new_worker
from workflows.contracts import PromptJobResult
from workflows.prompt_job import PromptJobWorkflow
from workflows.results import job_result

OWNER = Scope("acme", "alice", "member")


@dataclass
class Harness:
    env: WorkflowEnvironment
    settings: Settings
    projection: Projection
    dispatcher: Dispatcher

    def worker(self, **overrides: Any) -> Worker:
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        return new_worker(settings, self.env.client, self.projection)

    async def submit(self, prompt: str = "hello", **options: Any) -> Job:
        accepted = await self.projection.store.submit(
            OWNER,
            Submission(
                text=prompt,
                priority=50,
                max_attempts=int(options.pop("max_attempts", 3)),
                after=tuple(options.pop("after", ())),
                options=options,
            ),
        )
        return accepted.job

    async def start(self, job: Job) -> WorkflowHandle[Any, PromptJobResult]:
        await self.dispatcher.start(job)
        return self.env.client.get_workflow_handle_for(PromptJobWorkflow.run, job.job_id)

    async def result(self, handle: WorkflowHandle[Any, PromptJobResult]) -> PromptJobResult:
        """The job's outcome its workflow reports (a Failed workflow of ours is a failed job).
        The time-skipping server's history long-poll sometimes returns before the close
        event while it skips time; ask again."""
        for _ in range(20):
            try:
                return await job_result(handle)
            except RuntimeError as err:
                if "No completion event found" not in str(err):
                    raise
        raise AssertionError(f"workflow {handle.id} did not complete")

    async def run(self, job: Job) -> PromptJobResult:
        return await self.result(await self.start(job))

    async def job(self, job_id: str) -> Job:
        return await self.projection.store.job(OWNER, job_id)

    async def events(self, job_id: str) -> list[JobEvent]:
        return await self.projection.store.job_events(OWNER, job_id)

    async def states(self, job_id: str) -> list[str]:
        return [e.state.value for e in await self.events(job_id)]


@pytest.fixture
async def harness(time_skipping_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Harness]:
    settings = make_settings(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'projection.db'}",
        job_ceiling_s=900.0,
        heartbeat_timeout_s=5.0,
        # The test server does not skip activity retry backoff; keep real waits short.
        # The default policy's figures are covered in tests/unit/test_backoff.py.
        backoff_initial_s=1.0,
        backoff_coefficient=2.0,
        backoff_jitter=0.0,
        rate_limit_default_s=1.5,
    )
    async with open_projection(settings) as projection:
        dispatcher = build_dispatcher(settings, time_skipping_env.client, projection)
        yield Harness(time_skipping_env, settings, projection, dispatcher)
