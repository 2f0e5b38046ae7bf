"""The job row as clients see it: one shape for the event log's data, polling and the API.

The projector stores it in each job event (so an SSE client gets the row as it was after
that transition); the API serves the same model (api/schemas.JobOut) for `GET /v1/jobs`.
A field added here appears in both, and in the OpenAPI document.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, model_validator

from projections.domain.lifecycle import ErrorKind, JobState
from projections.models import Job


def _utc(value: datetime | None) -> datetime | None:
    return value.astimezone(UTC) if value is not None else None


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


# UTC ISO-8601 with `Z`, whatever zone the database session handed back.
Timestamp = Annotated[
    datetime, AfterValidator(_utc), PlainSerializer(_iso, return_type=str, when_used="json")
]


class JobRow(BaseModel):
    """The job row of the API's contract (docs/api.md) (UTC ISO-8601 timestamps)."""

    model_config = ConfigDict(from_attributes=True)

    job_id: str
    prompt_id: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    waiting_on: list[str] | None = Field(
        description="A chain's parent prompts whose current job has not succeeded yet: the "
        "job stays queued until they have (retry a failed parent to go on)"
    )
    options: dict[str, Any] | None = Field(
        description="The options this job runs with: its prompt's, or those its retry gave. "
        "Null, with `options_omitted`, in a listing or an event when they are long"
    )
    options_omitted: bool = Field(
        default=False,
        description="The options are longer than a listing or an event carries (over 4 KiB "
        "of JSON, as a long `system` makes them): `GET /v1/jobs/{id}` has them",
    )
    error_kind: ErrorKind | None
    error_message: str | None
    next_attempt_at: Timestamp | None
    waiting_for: str | None = Field(
        default=None,
        description="Why a queued job waits for provider capacity (its provider budget is "
        "spent for the minute, or paused by the provider's 429), with `next_attempt_at` when "
        "room is expected, or for its provider batch (a deferrable job); null once it runs",
    )
    response_id: str | None
    supersedes: str | None
    superseded_by: str | None
    scheduled_for: Timestamp | None
    created_at: Timestamp
    updated_at: Timestamp
    started_at: Timestamp | None = Field(description="When the first attempt started")
    attempt_started_at: Timestamp | None = Field(
        description="When the current (latest) attempt started"
    )
    finished_at: Timestamp | None
    cancel_requested_at: Timestamp | None = Field(
        default=None,
        description="When a cancel was asked for: the job is being stopped (a running call "
        "is closed within a moment) and shows `cancelled` once it has stopped",
    )
    # Defaults: events logged before migration 0009 hold rows without them (and see
    # `_as_logged_before` for the fields the API always sends but older events lack).
    input_tokens: int = Field(
        default=0, description="Input tokens of every attempt that recorded its usage, summed"
    )
    output_tokens: int = Field(default=0, description="Output tokens of those attempts, summed")
    cost_usd: float | None = Field(
        default=None,
        description="What those attempts cost by the workers' price table, in US dollars; "
        "null until an attempt has consumed tokens, and when unknown (an attempt ran on a "
        "model without a price): never 0 for nothing spent",
    )

    @model_validator(mode="after")
    def _nothing_spent_has_no_cost(self) -> JobRow:
        # The row starts at 0: read as null until tokens were counted, so a job does not go
        # from 0 to null when its model turns out to have no price.
        if self.cost_usd == 0 and self.input_tokens == 0 and self.output_tokens == 0:
            self.cost_usd = None
        return self

    @model_validator(mode="before")
    @classmethod
    def _as_logged_before(cls, data: Any) -> Any:
        """A job event keeps the row as it was written, by whatever schema was current then:
        rows logged before migration 0004 lack `options` and `attempt_started_at`, before
        0005 `waiting_on`. Each reads as null (what the row held for it then) rather than
        failing, so an old event never blocks a stream that replays it. These fields stay
        required in the API's document: the API sends them on every row."""
        if isinstance(data, dict) and not ADDED_LATER <= data.keys():
            return {**dict.fromkeys(ADDED_LATER), **data}
        return data


# Fields of the row that events written by an earlier schema may lack.
ADDED_LATER = frozenset({"options", "attempt_started_at", "waiting_on"})


# The most of a job's options (as JSON) a listed row or an event carries. A job's options
# never change, so leaving long ones out loses nothing a GET of the job does not give; left
# in, one tenant's 100 kB `system` would weigh on every listing, event and stream of theirs.
LISTED_OPTIONS_BYTES = 4096


Row = TypeVar("Row", bound="JobRow")


def options_weight(options: dict[str, Any]) -> int:
    """The length of `options` as the projection stores them: SQLAlchemy's JSON type writes
    `json.dumps` (ASCII, so characters are bytes), which the listing queries measure in SQL
    (`reads.listed_jobs`). One measure, so a job is cut alike in a listing and an event."""
    return len(json.dumps(options))


def listed(row: Row) -> Row:
    """`row` as a listing or an event carries it: long options left out and flagged."""
    options = row.options
    if not options or options_weight(options) <= LISTED_OPTIONS_BYTES:
        return row
    return row.model_copy(update={"options": None, "options_omitted": True})


def job_row(job: Job) -> dict[str, Any]:
    """The row as JSON-ready values (what a job event stores)."""
    return listed(JobRow.model_validate(job)).model_dump(mode="json")
