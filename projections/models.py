"""SQLAlchemy models of the projection: API keys, prompts, jobs, job events, responses, each
job's streamed output and each attempt's usage, and worker processes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from projections.domain.lifecycle import ErrorKind, JobState

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
EventId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps are stored and returned as aware UTC datetimes on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def lifecycle_enum(words: type[JobState] | type[ErrorKind], name: str, length: int) -> Enum:
    """A column of one of the lifecycle's words, stored as its value (a VARCHAR)."""
    return Enum(
        words,
        name=name,
        native_enum=False,
        length=length,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


StateColumn = lifecycle_enum(JobState, "job_state", 16)
ErrorKindColumn = lifecycle_enum(ErrorKind, "error_kind", 32)


def one_of(column: str, values: type[JobState] | type[ErrorKind], name: str) -> CheckConstraint:
    """The database refuses a value the lifecycle does not know (migration 0003)."""
    listed = ", ".join(f"'{value.value}'" for value in values)
    return CheckConstraint(f"{column} IN ({listed})", name=name)


class ApiKey(Base):
    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    org: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The most its jobs may spend in a UTC day, in US dollars (null: no cap of its own; its
    # org's cap applies all the same). projections/spend.py.
    usd_per_day: Mapped[float | None] = mapped_column(Float)


class Prompt(Base):
    __tablename__ = "prompts"
    __table_args__ = (
        UniqueConstraint("org", "author", "idempotency_key", name="uq_prompts_idempotency"),
        Index("ix_prompts_org_created", "org", "created_at"),
    )

    prompt_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    org: Mapped[str] = mapped_column(String(64))
    author: Mapped[str] = mapped_column(String(64))
    # A conversation's transcript (activities/adapters/conversation.py), else the prompt.
    text: Mapped[str] = mapped_column(Text)
    # A conversation: its messages as sent (the chat format); None: `text` is one user message.
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True))
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    parent_id: Mapped[str | None] = mapped_column(String(40))
    # A chain: the prompts this one runs after, in the order `{{after[i]}}` names them.
    after: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    correlation_id: Mapped[str | None] = mapped_column(String(128))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    # A prompt made through the OpenAI-compatible routes (api/openai/): what they echo back
    # that promptjobs itself has no field for (`model` as sent, `metadata`, `background`).
    openai: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class PromptParent(Base):
    """One edge of a chain: `prompt_id` runs after `parent_id` (the reverse of Prompt.after,
    so a parent's children are one index lookup)."""

    __tablename__ = "prompt_parents"
    __table_args__ = (Index("ix_prompt_parents_parent", "parent_id"),)

    prompt_id: Mapped[str] = mapped_column(ForeignKey("prompts.prompt_id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    parent_id: Mapped[str] = mapped_column(ForeignKey("prompts.prompt_id"))


class Job(Base):
    __tablename__ = "jobs"
    # Not a column: True where a listing's read left long options out (projections/reads.py).
    options_omitted = False
    __table_args__ = (
        # GET /v1/jobs?since=: the caller's jobs in change order.
        Index("ix_jobs_org_last_event", "org", "last_event_id"),
        Index("ix_jobs_org_author_last_event", "org", "author", "last_event_id"),
        # ... with ?state=.
        Index("ix_jobs_org_state_last_event", "org", "state", "last_event_id"),
        Index("ix_jobs_org_author_state_last_event", "org", "author", "state", "last_event_id"),
        # The dispatcher's scan for committed-but-unstarted jobs and pending cancels.
        Index("ix_jobs_undispatched", "dispatched_at", "state"),
        Index("ix_jobs_prompt", "prompt_id"),
        Index("ix_jobs_state_updated", "state", "updated_at"),
        # The dispatcher's look for jobs waiting for a slot of their org's running limit.
        Index("ix_jobs_awaiting_slot", "awaiting_slot_since"),
        one_of("state", JobState, "state"),
        one_of("error_kind", ErrorKind, "error_kind"),
    )

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    prompt_id: Mapped[str] = mapped_column(ForeignKey("prompts.prompt_id"))
    org: Mapped[str] = mapped_column(String(64))
    author: Mapped[str] = mapped_column(String(64))
    # The API key that submitted it (null: before migration 0022, or made by the operator or
    # a batch): its spend counts against that key's cap.
    key_id: Mapped[str | None] = mapped_column(String(32))
    state: Mapped[JobState] = mapped_column(StateColumn)
    priority: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    # What this job runs with: the prompt's options, or a retry's replacement. Null only on
    # rows older than migration 0004 that it could not fill: read the prompt's then.
    options: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # The parent prompts (of a chain) whose current job has not succeeded yet, as the job's
    # workflow last checked; null once they all have (or for a prompt with no parents).
    waiting_on: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    progress_rank: Mapped[int] = mapped_column(Integer, default=1)
    error_kind: Mapped[ErrorKind | None] = mapped_column(ErrorKindColumn)
    error_message: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    response_id: Mapped[str | None] = mapped_column(String(40))
    supersedes: Mapped[str | None] = mapped_column(String(40))
    superseded_by: Mapped[str | None] = mapped_column(String(40))
    worker: Mapped[str | None] = mapped_column(String(255))
    scheduled_for: Mapped[datetime | None] = mapped_column(UTCDateTime())
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # When the job took one of its org's running slots (projections/admission.py): from its
    # first attempt's start until it settles it counts against the org's limit.
    admitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Since when its workflow waits for such a slot (null once admitted, or never refused).
    awaiting_slot_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Why a queued job waits for provider capacity (projections/budgets.py), until about
    # `next_attempt_at`; null once it runs.
    waiting_for: Mapped[str | None] = mapped_column(Text)
    # Which of its places the job runs at now: 0 its own provider and model, i the i-th of
    # `options.fallbacks` (activities/adapters/options.py `on_target`).
    fallback: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The job's own webhook (its submission's `webhook`), signed with its org's secret
    # (WebhookSigning), and the events it wants (null: its end); a retry's job keeps them.
    webhook: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    last_event_id: Mapped[int] = mapped_column(EventId, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # When the current attempt started (started_at is the first attempt's).
    attempt_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # What the job's attempts consumed, summed as each attempt ends (the `attempts` table has
    # each one). cost_usd is NULL once an attempt ran on a model the price table does not
    # know: unknown, not 0 (NULL + x stays NULL in SQL).
    input_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    output_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cost_usd: Mapped[float | None] = mapped_column(Float, default=0.0, server_default="0")


def job_options(job: Job, prompt: Prompt) -> dict[str, Any]:
    """The options a job runs with (rows from before migration 0004 may have none: the
    prompt's, which is what they ran with)."""
    return dict(prompt.options or {}) if job.options is None else dict(job.options)


class JobEvent(Base):
    """The append-only log of applied transitions; its id is the polling and SSE cursor."""

    __tablename__ = "job_events"
    __table_args__ = (
        # GET /v1/events: an admin's stream, a member's, one job's, one prompt's.
        Index("ix_job_events_org_id", "org", "id"),
        Index("ix_job_events_org_author_id", "org", "author", "id"),
        Index("ix_job_events_job_id", "job_id", "id"),
        Index("ix_job_events_prompt_id", "prompt_id", "id"),
        one_of("state", JobState, "state"),
        # Ids are cursors: never hand one out twice, even after the newest events are
        # archived (migration 0004). PostgreSQL's come from the writing transaction.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(String(40))
    prompt_id: Mapped[str] = mapped_column(String(40))
    org: Mapped[str] = mapped_column(String(64))
    author: Mapped[str] = mapped_column(String(64))
    state: Mapped[JobState] = mapped_column(StateColumn)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Response(Base):
    __tablename__ = "responses"
    __table_args__ = (Index("ix_responses_job", "job_id"),)

    response_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(40))
    prompt_id: Mapped[str] = mapped_column(String(40))
    org: Mapped[str] = mapped_column(String(64))
    author: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    # The calls the model asked for ({id, name, arguments}), if it asked for any.
    tool_calls: Mapped[list[dict[str, str]] | None] = mapped_column(JSON(none_as_null=True))
    # The answer's JSON, parsed and validated against the job's output_schema (null: the job
    # had none, or answered with tool calls).
    output_json: Mapped[Any] = mapped_column(JSON(none_as_null=True), nullable=True)
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    provider_request_id: Mapped[str | None] = mapped_column(String(255))
    finish_reason: Mapped[str | None] = mapped_column(String(64))
    input_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int | None] = mapped_column(Integer)
    first_token_ms: Mapped[int | None] = mapped_column(Integer)
    usage_estimated: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    cost_usd: Mapped[float | None] = mapped_column(Float)
    attempt: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobOutput(Base):
    """The text and tool calls a job's current attempt has streamed so far (each batch is
    also a `job.output` event in the log). A new attempt that starts after streamed output
    replaces it, with a `job.output_reset` event; once the job succeeds it equals the
    response."""

    __tablename__ = "job_outputs"

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    # Characters in `text`: the offset the next batch must start at.
    length: Mapped[int] = mapped_column(Integer)
    # The tool calls streamed so far (id, name, the arguments' text so far), in the answer's
    # order; None: none. Each write holds them whole: arguments only grow.
    tool_calls: Mapped[list[dict[str, str]] | None] = mapped_column(JSON(none_as_null=True))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AttemptRecord(Base):
    """What one attempt consumed and how it ended, written once by the attempt's worker when
    the call ends (succeeded, failed, cancelled). An attempt whose worker died records
    nothing: its usage is unknown."""

    __tablename__ = "attempts"
    __table_args__ = (
        # promptjobs jobs metrics: usage per org (and per model) since a time.
        Index("ix_attempts_org_ended", "org", "ended_at"),
        Index("ix_attempts_ended", "ended_at"),
    )

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    org: Mapped[str] = mapped_column(String(64))
    # succeeded, cancelled, or the error kind the attempt failed with.
    outcome: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    input_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    usage_estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    output_chars: Mapped[int] = mapped_column(Integer, default=0)
    first_token_ms: Mapped[int | None] = mapped_column(Integer)
    duration_ms: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # How the call was made, where it was not one direct call: "provider batch …", or why
    # a deferrable job ran directly (issue 33).
    via: Mapped[str | None] = mapped_column(String(255))
    # What a schema_mismatch attempt answered and why it missed ({"answer", "errors": [{path,
    # message}]}): the next attempt's repair turn, and the attempts endpoint's word.
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))

    @property
    def errors(self) -> list[dict[str, str]] | None:
        """A schema_mismatch attempt's validation errors (path, message), from `detail`."""
        errors: list[dict[str, str]] | None = (self.detail or {}).get("errors")
        return errors

    @property
    def moved_on(self) -> str | None:
        """Why the job's next attempt ran at its next place (`options.fallbacks`), where
        this attempt's failure moved it on (`detail`)."""
        why: str | None = (self.detail or {}).get("moved_on")
        return why


class WorkerProcess(Base):
    """One worker process: what it runs with and when it last said it was alive. Each row is
    written only by its own process (docs/operators.md, `promptjobs status`)."""

    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_heartbeat_at", "heartbeat_at"),)

    identity: Mapped[str] = mapped_column(String(255), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime())
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    config: Mapped[dict[str, Any]] = mapped_column(JSON)


class OrgLimit(Base):
    """One org's own running limit, in place of PROMPTJOBS_ORG_MAX_RUNNING (0: no limit).
    Set with `promptjobs orgs limit`; read by every worker at each admission."""

    __tablename__ = "org_limits"

    org: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Null: the default running limit applies.
    max_running: Mapped[int | None] = mapped_column(Integer)
    # Tokens a minute its calls may draw on provider budgets, all told (null: no quota).
    tpm: Mapped[int | None] = mapped_column(Integer)
    # The most its jobs may spend in a UTC day, in US dollars (null: no cap), and what a
    # submission past it meets: "wait" (null: accepted, and queued until there is room) or
    # "refuse" (429 insufficient_quota). projections/spend.py.
    usd_per_day: Mapped[float | None] = mapped_column(Float)
    over_cap: Mapped[str | None] = mapped_column(String(8))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ProviderBudget(Base):
    """One provider budget: the requests and tokens a minute every worker together may send
    to one provider's model (projections/budgets.py). The operator's limits win over those
    learned from the provider's rate-limit headers; a 429 pauses it for every worker."""

    __tablename__ = "provider_budgets"

    # `provider/model`, e.g. `openai/gpt-4o-mini`.
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    learned_rpm: Mapped[int | None] = mapped_column(Integer)
    learned_tpm: Mapped[int | None] = mapped_column(Integer)
    # No call draws from it before this (the provider's Retry-After on its last 429).
    paused_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # While set (and no limit known), one call is out to learn the provider's limits from its
    # answer; the others wait for it. Past it, the next call probes again.
    probe_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # 429s the provider answered on it, all told.
    rate_limited: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ProviderCircuit(Base):
    """One place's circuit (projections/circuits.py): outage failures in a row there across
    the fleet, and, once they reach the threshold, until when jobs that can run elsewhere
    are sent elsewhere. A success there closes it."""

    __tablename__ = "provider_circuits"

    # `provider/model`, as budgets name it.
    place: Mapped[str] = mapped_column(String(200), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    open_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Past its cool-down, while it has not answered again: one attempt at a time may try the
    # place (the probe), until this; the others keep going elsewhere.
    probe_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # When it last opened, and how often, all told (`promptjobs status`, /metrics).
    opened_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    opened: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class BudgetDraw(Base):
    """One call's draw on a budget: a request, and its tokens (reserved as an estimate when
    the attempt starts, then what the provider reported). A budget's last minute of draws is
    what it has spent."""

    __tablename__ = "budget_draws"
    __table_args__ = (
        Index("ix_budget_draws_budget_at", "budget", "drawn_at"),
        Index("ix_budget_draws_job", "job_id", "attempt"),
    )

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    budget: Mapped[str] = mapped_column(String(200))
    job_id: Mapped[str] = mapped_column(String(40))
    attempt: Mapped[int] = mapped_column(Integer)
    drawn_at: Mapped[datetime] = mapped_column(UTCDateTime())
    tokens: Mapped[int] = mapped_column(Integer)
    # Whether `tokens` is what the provider reported (else the reservation's estimate).
    reconciled: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")


class SpendHold(Base):
    """What a call under a spend cap may cost, held from the transaction that starts it until
    its attempt's record (`attempts`, with what it did cost) takes its place in the same one.
    A call whose worker died keeps its hold for the day: its cost is unknown, not nothing."""

    __tablename__ = "spend_holds"
    __table_args__ = (
        Index("ix_spend_holds_org_held", "org", "held_at"),
        Index("ix_spend_holds_key_held", "key_id", "held_at"),
    )

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    org: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str | None] = mapped_column(String(32))
    usd: Mapped[float] = mapped_column(Float)
    held_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SpendWaiter(Base):
    """A queued job waiting for room under a spend cap (`cap`: `org:NAME` or `key:ID`): the
    dispatcher wakes the longest waiting first as the room allows (the cap raised, or calls
    that cost less than they held)."""

    __tablename__ = "spend_waiters"
    __table_args__ = (Index("ix_spend_waiters_cap_since", "cap", "since"),)

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    cap: Mapped[str] = mapped_column(String(100))
    usd: Mapped[float] = mapped_column(Float)
    since: Mapped[datetime] = mapped_column(UTCDateTime())


class BudgetWaiter(Base):
    """A queued job waiting for room in a budget; the lowest `rank` goes first. The rank is
    priority x PROMPTJOBS_PRIORITY_AGING_S + the epoch second it began to wait, so a job's
    effective priority improves by one for every aging period it waits (docs/decisions.md)."""

    __tablename__ = "budget_waiters"
    __table_args__ = (Index("ix_budget_waiters_budget_rank", "budget", "rank"),)

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    budget: Mapped[str] = mapped_column(String(200))
    rank: Mapped[float] = mapped_column(Float)
    tokens: Mapped[int] = mapped_column(Integer)
    since: Mapped[datetime] = mapped_column(UTCDateTime())


class StoredFile(Base):
    """A file uploaded through `POST /v1/files` (OpenAI's Files API): its content is in
    `file_chunks`, so any API process can read it and none holds it whole."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_org_created", "org", "created_at"),)

    file_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    org: Mapped[str] = mapped_column(String(64))
    author: Mapped[str] = mapped_column(String(64))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class FileChunk(Base):
    __tablename__ = "file_chunks"

    # No foreign key: a file's chunks are written before its row (projections/files.py).
    file_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Batch(Base):
    """A batch (OpenAI's Batch API): each line of its input file is one prompt and its job."""

    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_org_created", "org", "created_at"),
        Index("ix_batches_status", "status"),
    )

    batch_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    org: Mapped[str] = mapped_column(String(64))
    author: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(16))
    # `metadata` is SQLAlchemy's own attribute on a declarative class.
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON(none_as_null=True))
    status: Mapped[str] = mapped_column(String(16))
    # Lines in the input file, once it has been read; lines accepted as jobs so far.
    total: Mapped[int] = mapped_column(Integer, default=0)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    # Counts written when the batch is over (until then they are counted from its jobs).
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True))
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class BatchLine(Base):
    """One line of a batch's input file: the prompt it became."""

    __tablename__ = "batch_lines"
    __table_args__ = (
        UniqueConstraint("batch_id", "custom_id", name="uq_batch_lines_custom_id"),
        Index("ix_batch_lines_prompt", "prompt_id"),
    )

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.batch_id"), primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(512))
    prompt_id: Mapped[str] = mapped_column(String(40))


class ProviderBatch(Base):
    """One provider batch (OpenAI's Batch API, Anthropic's Message Batches) that deferrable
    jobs of one provider and model were gathered into; its life is a ProviderBatchWorkflow
    whose id is `batch_id` (projections/provider_batches.py)."""

    __tablename__ = "provider_batches"
    __table_args__ = (
        Index("ix_provider_batches_state", "state", "created_at"),
        Index("ix_provider_batches_provider", "provider", "created_at"),
    )

    batch_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    # gathered → sent → ended; or unsupported (the provider has no batch API).
    state: Mapped[str] = mapped_column(String(16))
    jobs: Mapped[int] = mapped_column(Integer)
    # Set once its workflow has been started (a sweep starts those left unset).
    workflow_started: Mapped[bool] = mapped_column(Boolean, default=False)
    provider_batch_id: Mapped[str | None] = mapped_column(String(255))
    provider_status: Mapped[str | None] = mapped_column(String(32))
    note: Mapped[str | None] = mapped_column(Text)
    # Result lines that named no job we could read, and second copies of a job's line: each
    # settled nothing (the first copy settles its job), counted here and logged.
    unreadable_lines: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    duplicate_lines: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # When a send began and how many lines it held: a try after it looks for the batch that
    # send may have made before it sends again (the provider's answer may have been lost).
    sending_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    lines_sent: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class DeferredJob(Base):
    """A deferrable job waiting for, or gathered into, a provider batch."""

    __tablename__ = "deferred_jobs"
    __table_args__ = (
        Index("ix_deferred_jobs_gather", "batch_id", "provider", "model", "deferred_at"),
    )

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    org: Mapped[str] = mapped_column(String(64))
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    deferred_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # None while it waits to be gathered.
    batch_id: Mapped[str | None] = mapped_column(String(40))
    # The attempt its batch started, once the provider runs it; what the batch told the
    # job's workflow once its line was settled (a repeated settling tells it again).
    attempt: Mapped[int | None] = mapped_column(Integer)
    verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))


class WebhookEndpoint(Base):
    """Where an org's job events are sent (projections/webhooks.py): its URL, the event types
    it wants, and the secret its deliveries are signed with (Standard Webhooks); while a
    rotation overlaps, the previous secret signs too, until `previous_until`."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_org", "org"),)

    endpoint_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    org: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    # The event types it wants (`job.succeeded`, …); an empty list: every job end.
    events: Mapped[list[str]] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(String(255))
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    previous_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Set: nothing more is sent to it (410 Gone, or failing for days), and why.
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class WebhookDelivery(Base):
    """One event for one endpoint: written in the transaction of the state change it tells
    of (the outbox), then sent by its own workflow until a 2xx or the retries' end. Its id is
    the `webhook-id` every try of it carries."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_endpoint_created", "endpoint_id", "created_at"),
        # An org's jobs' own webhooks share the endpoint id JOB_WEBHOOKS.
        Index("ix_webhook_deliveries_org_endpoint_created", "org", "endpoint_id", "created_at"),
        Index("ix_webhook_deliveries_undispatched", "dispatched_at", "created_at"),
    )

    delivery_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(String(40))
    org: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(String(40))
    # The body, fixed when the event happened: every try sends the same bytes.
    payload: Mapped[str] = mapped_column(Text)
    # Where it goes when it is a job's own webhook (its endpoint_id is then JOB_WEBHOOKS,
    # "default", and it is signed with its org's WebhookSigning); null: to its endpoint.
    url: Mapped[str | None] = mapped_column(Text)
    # pending, delivered, failed (retries over, or its endpoint disabled or gone)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # When its workflow was started (null: not yet; the dispatcher's scan starts it).
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookSigning(Base):
    """An org's secret for its jobs' own webhooks (a submission's `webhook`), made at its
    first use; while a rotation overlaps, the previous secret signs too."""

    __tablename__ = "webhook_signing"

    org: Mapped[str] = mapped_column(String(64), primary_key=True)
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    previous_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
