"""An upgraded store keeps serving its history: events written by every earlier schema stream,
resume and page on the current code, over real HTTP.

Each era's jobs are written while the store stands at that era's last migration, with the
rows its code logged (the job row's fields as `job_row` wrote them then); the store is then
migrated to head and served by the current API, as an operator's upgrade does."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import MetaData, create_engine, insert
from temporalio.testing import WorkflowEnvironment

from projections.domain.lifecycle import EventType, JobState
from projections.engines import sync_url
from projections.migrate import alembic_config
from tests.conftest import make_settings, running_stack
from tests.integration.event_stream import all_terminal, read_events

# The job row's fields as each schema's code logged them in an event.
FIRST = [
    "job_id", "prompt_id", "state", "priority", "attempt", "max_attempts", "error_kind",
    "error_message", "next_attempt_at", "response_id", "supersedes", "superseded_by",
    "scheduled_for", "created_at", "updated_at", "started_at", "finished_at",
]  # fmt: skip
ERAS = {
    # revision the store stood at: the fields its events carry
    "0003": FIRST,
    "0004": [*FIRST, "options", "attempt_started_at"],
    "0008": [*FIRST, "options", "attempt_started_at", "waiting_on"],
}
ORG, AUTHOR = "acme", "alice"


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def write_era(url: str, fields: list[str], n: int) -> list[str]:
    """`n` succeeded jobs, each with its queued, running and succeeded events, written as
    the code of the store's current revision wrote them; the job ids."""
    engine = create_engine(sync_url(url))
    tables = MetaData()
    tables.reflect(engine)
    now = datetime.now(UTC) - timedelta(hours=1)
    job_ids: list[str] = []

    def row(table: str, values: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if k in tables.tables[table].c}

    with engine.begin() as db:
        for _ in range(n):
            prompt_id, job_id = f"pmt_{uuid.uuid4().hex}", f"job_{uuid.uuid4().hex}"
            job_ids.append(job_id)
            base = {"prompt_id": prompt_id, "org": ORG, "author": AUTHOR, "created_at": now}
            db.execute(
                insert(tables.tables["prompts"]),
                row("prompts", {**base, "text": "an old prompt", "options": {}}),
            )
            event_ids = []
            for attempt, state in enumerate(
                (JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED)
            ):
                logged = {
                    "job_id": job_id, "prompt_id": prompt_id, "state": state.value,
                    "priority": 50, "attempt": min(attempt, 1), "max_attempts": 3,
                    "error_kind": None, "error_message": None, "next_attempt_at": None,
                    "response_id": None, "supersedes": None, "superseded_by": None,
                    "scheduled_for": None, "created_at": _iso(now), "updated_at": _iso(now),
                    "started_at": _iso(now) if attempt else None, "options": None,
                    "attempt_started_at": _iso(now) if attempt else None, "waiting_on": None,
                    "finished_at": _iso(now) if state is JobState.SUCCEEDED else None,
                }  # fmt: skip
                inserted = db.execute(
                    insert(tables.tables["job_events"]),
                    row(
                        "job_events",
                        {
                            **base,
                            "job_id": job_id,
                            "type": EventType.STATE_CHANGED.value,
                            "state": state.value,
                            "data": {k: logged[k] for k in fields},
                        },
                    ),
                )
                event_ids.append(inserted.inserted_primary_key[0])
            job = {
                **base,
                "job_id": job_id,
                "state": JobState.SUCCEEDED.value,
                "priority": 50,
                "attempt": 1,
                "max_attempts": 3,
                "progress_rank": 100,
                "last_event_id": event_ids[-1],
                "updated_at": now,
                "started_at": now,
                "finished_at": now,
                "options": {},
                "attempt_started_at": now,
            }
            db.execute(insert(tables.tables["jobs"]), row("jobs", job))
    engine.dispose()
    return job_ids


async def test_events_of_every_earlier_schema_stream_and_resume_after_an_upgrade(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    config = alembic_config(url)
    jobs: dict[str, list[str]] = {}
    for revision, fields in ERAS.items():
        command.upgrade(config, revision)
        jobs[revision] = write_era(url, fields, 2)
    everyone = {job for era in jobs.values() for job in era}

    settings = make_settings(tmp_path, database_url=url)
    async with running_stack(settings, dev_server.client, run_worker=False) as stack:
        http = stack.as_user(await stack.key(ORG, AUTHOR))
        # The whole log from the start: every old job's three events, nothing stuck.
        events = await read_events(http, all_terminal(everyone), params={"since": "0"})
        assert len(events) == 3 * len(everyone)
        first_era = [e for e in events if e.job_id in jobs["0003"]]
        assert [e.state for e in first_era[:3]] == ["queued", "running", "succeeded"]
        assert first_era[0].job["options"] is None and first_era[0].job["waiting_on"] is None

        # A resume at or before an old event goes past it too.
        resumed = await read_events(
            http,
            all_terminal(everyone - {events[0].job_id}),
            headers={"Last-Event-ID": str(events[1].id)},
        )
        assert [e.id for e in resumed] == [e.id for e in events[2:]]

        # Polling serves the rows, which the migrations brought up to date.
        listing = (await http.get("/v1/jobs", params={"since": "0"})).json()
        assert {row["job_id"] for row in listing["jobs"]} == everyone


async def test_a_job_queued_by_the_previous_release_runs_to_its_end_after_the_upgrade(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A job the release before provider fallbacks (schema 0019) accepted and had not yet
    started: after the upgrade (a job's place, `jobs.fallback`, 0020; circuits, 0021) the
    current dispatcher starts it, the worker runs it at its own place, and its stream shows
    its old event and its new ones."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0019")
    engine = create_engine(sync_url(url))
    tables = MetaData()
    tables.reflect(engine)
    now = datetime.now(UTC)
    prompt_id, job_id = f"pmt_{uuid.uuid4().hex}", f"job_{uuid.uuid4().hex}"
    base = {"prompt_id": prompt_id, "org": ORG, "author": AUTHOR, "created_at": now}
    options = {"provider": "fake"}
    # The row as that code logged it in the job's queued event.
    logged = {
        "job_id": job_id, "prompt_id": prompt_id, "state": "queued", "priority": 50,
        "attempt": 0, "max_attempts": 3, "error_kind": None, "error_message": None,
        "next_attempt_at": None, "response_id": None, "supersedes": None,
        "superseded_by": None, "scheduled_for": None, "created_at": _iso(now),
        "updated_at": _iso(now), "started_at": None, "finished_at": None, "options": options,
        "attempt_started_at": None, "waiting_on": None,
    }  # fmt: skip
    with engine.begin() as db:
        db.execute(
            insert(tables.tables["prompts"]),
            {**base, "text": "queued before the upgrade", "options": options},
        )
        queued = {
            **base, "job_id": job_id, "state": JobState.QUEUED.value, "priority": 50,
            "attempt": 0, "max_attempts": 3, "progress_rank": 1, "updated_at": now,
            "options": options, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0,
        }  # fmt: skip
        event = db.execute(
            insert(tables.tables["job_events"]),
            {
                **base,
                "job_id": job_id,
                "type": EventType.STATE_CHANGED.value,
                "state": JobState.QUEUED.value,
                "data": logged,
            },
        )
        db.execute(
            insert(tables.tables["jobs"]),
            {**queued, "last_event_id": event.inserted_primary_key[0]},
        )
    engine.dispose()

    settings = make_settings(tmp_path, database_url=url)
    async with running_stack(settings, dev_server.client) as stack:
        http = stack.as_user(await stack.key(ORG, AUTHOR))
        events = await read_events(http, all_terminal({job_id}), params={"since": "0"})
        assert [e.state for e in events] == ["queued", "running", "succeeded"]
        attempts = (await http.get(f"/v1/jobs/{job_id}/attempts")).json()["attempts"]
        assert [(a["provider"], a["outcome"], a["via"]) for a in attempts] == [
            ("fake", "succeeded", None)
        ]
