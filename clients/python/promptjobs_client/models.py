"""The wire shapes of the promptjobs API, as this client reads and sends them.

Its own, not imported from the server, so the client installs alone. What the server answers
is read leniently (a field a newer server adds is ignored); what the client sends is checked
strictly before it leaves, with the server's rules for the fields it has, so a mistake costs
no round trip. The server's test suite checks these against its OpenAPI document
(tests/unit/test_client_models.py), so they cannot drift.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictInt, StrictStr

Parsed = TypeVar("Parsed", bound=BaseModel)

# What the server answers: read as far as this client knows it.
ANSWER = ConfigDict(extra="ignore")
# What the client sends: exactly the fields the API takes.
REQUEST = ConfigDict(extra="forbid")


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


class EventType(StrEnum):
    """The `event:` names of `GET /v1/events`."""

    STATE_CHANGED = "job.state_changed"
    OUTPUT = "job.output"
    OUTPUT_RESET = "job.output_reset"
    USAGE = "job.usage"
    DONE = "job.done"


# -- answers ---------------------------------------------------------------------------------


class JobOut(BaseModel):
    """A job row (the API's `JobOut`)."""

    model_config = ANSWER

    job_id: str
    prompt_id: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    waiting_on: list[str] | None = None
    options: dict[str, Any] | None = None
    options_omitted: bool = False
    error_kind: str | None = None
    error_message: str | None = None
    next_attempt_at: datetime | None = None
    waiting_for: str | None = None
    response_id: str | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    scheduled_for: datetime | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    attempt_started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    # The job's own webhook (its submission's), and the events it wants there.
    webhook: str | None = None
    webhook_events: list[str] | None = None


class Accepted(BaseModel):
    model_config = ANSWER

    prompt_id: str
    job_id: str
    state: JobState


class JobList(BaseModel):
    model_config = ANSWER

    jobs: list[JobOut]
    next_cursor: str


class PromptOut(BaseModel):
    model_config = ANSWER

    prompt_id: str
    # The prompt, or a conversation's transcript (a line a message).
    prompt: str
    # A conversation as it was sent (None: a prompt given as text).
    messages: list[dict[str, Any]] | None = None
    author: str
    options: dict[str, Any]
    parent_id: str | None = None
    correlation_id: str | None = None
    after: list[str] = Field(default_factory=list)
    children: list[str] = Field(default_factory=list)
    created_at: datetime
    jobs: list[JobOut]
    job_count: int


class PromptList(BaseModel):
    model_config = ANSWER

    prompts: list[PromptOut]
    next_before: str | None = None
    cursor: str


class Usage(BaseModel):
    model_config = ANSWER

    input_tokens: int | None = None
    output_tokens: int | None = None
    usage_estimated: bool = False
    cost_usd: float | None = None


class FunctionCall(BaseModel):
    model_config = ANSWER

    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(BaseModel):
    """A call the model asks for, as an assistant message carries it."""

    model_config = ANSWER

    id: str
    type: str = "function"
    function: FunctionCall


class ResponseOut(BaseModel):
    model_config = ANSWER

    response_id: str
    job_id: str
    prompt_id: str
    text: str
    # The calls the model asks for: run them, and send their results in the next job.
    tool_calls: list[ToolCall] | None = None
    # The answer as JSON, validated against the job's `output_schema` (None: no schema).
    output_json: Any = None
    provider: str
    model: str
    provider_request_id: str | None = None
    finish_reason: str | None = None
    usage: Usage
    latency_ms: int | None = None
    first_token_ms: int | None = None
    attempt: int
    created_at: datetime

    def parse(self, model: type[Parsed]) -> Parsed:
        """The answer as an instance of `model` (a pydantic model of the job's output schema,
        e.g. the one its schema came from: `Model.model_json_schema()`). The server validated
        the JSON against the schema; this validates it against the model. Raises
        `ValueError` if the job had no output schema."""
        if self.output_json is None:
            raise ValueError(
                f"response {self.response_id} has no output_json: its job had no schema"
            )
        return model.model_validate(self.output_json)


class OutputChunk(BaseModel):
    """A piece of a job's streamed output (a `job.output` event): text from `offset` on,
    and, when they grew, the attempt's tool calls so far, each whole (arguments so far)."""

    model_config = ANSWER

    job_id: str
    attempt: int
    offset: int
    text: str
    tool_calls: list[ToolCall] | None = None


class OutputReset(BaseModel):
    """A `job.output_reset` event: drop the text of earlier attempts."""

    model_config = ANSWER

    job_id: str
    attempt: int


class OutputOut(OutputChunk):
    done: bool


class AttemptOut(BaseModel):
    model_config = ANSWER

    attempt: int
    outcome: str
    provider: str
    model: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    usage_estimated: bool = False
    cost_usd: float | None = None
    output_chars: int = 0
    first_token_ms: int | None = None
    duration_ms: int
    started_at: datetime
    ended_at: datetime
    # The provider batch it ran in, or why a deferrable job ran directly.
    via: str | None = None
    # A schema_mismatch attempt's validation errors (the next attempt's repair turn).
    errors: list[SchemaError] | None = None
    # Why the job's next attempt ran at its next place (`options.fallbacks`).
    moved_on: str | None = None


class SchemaError(BaseModel):
    """Where an answer missed its schema (`path`, a JSON pointer) and how."""

    model_config = ANSWER

    path: str
    message: str


class AttemptList(BaseModel):
    model_config = ANSWER

    job_id: str
    attempts: list[AttemptOut]


class FieldError(BaseModel):
    model_config = ANSWER

    field: str
    message: str


class ProblemDetails(BaseModel):
    """RFC 9457 problem details, as the API sends every error."""

    model_config = ANSWER

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[FieldError] = Field(default_factory=list)
    job_id: str | None = None
    state: str | None = None
    prompt_id: str | None = None
    limit: int | None = None
    budget: str | None = None
    tokens: int | None = None
    tokens_per_minute: int | None = None
    usd_per_day: float | None = None
    resets_at: datetime | None = None


# -- requests ----------------------------------------------------------------------------------

Priority = Annotated[StrictInt, Field(ge=0, le=100)]
MaxAttempts = Annotated[StrictInt, Field(ge=1, le=10)]
PromptId = Annotated[StrictStr, Field(min_length=1, max_length=40)]


# What a job's own webhook may be told of.
WebhookEvent = Literal[
    "job.succeeded", "job.failed", "job.cancelled", "job.superseded", "job.running"
]


class SubmitPrompt(BaseModel):
    """`POST /v1/prompts`. `options` are checked by the server, which knows its providers."""

    model_config = REQUEST

    prompt: StrictStr | None = Field(default=None, min_length=1)
    # A conversation in the Chat Completions format (the server checks each message).
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1, max_length=2000)
    priority: Priority = 50
    max_attempts: MaxAttempts | None = None
    scheduled_for: AwareDatetime | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    parent_id: StrictStr | None = Field(default=None, max_length=40)
    correlation_id: StrictStr | None = Field(default=None, max_length=128)
    after: list[PromptId] = Field(default_factory=list, max_length=16)
    # A URL told of the job's end, signed with the org's secret for jobs' own webhooks.
    webhook: StrictStr | None = Field(default=None, min_length=1, max_length=2000)
    webhook_events: list[WebhookEvent] | None = Field(default=None, min_length=1, max_length=5)


class RetryJob(BaseModel):
    """`POST /v1/jobs/{id}/retry`: what the new job runs with instead (each optional)."""

    model_config = REQUEST

    options: dict[str, Any] | None = None
    priority: Priority | None = None
    max_attempts: MaxAttempts | None = None
