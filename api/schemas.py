"""Wire shapes of the API (separate from the SQL models)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictStr,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from activities.adapters.conversation import FunctionCall, Messages, ToolCall
from activities.adapters.json_types import JSON_INTEGER, NO_NUL, STRICT_BODY, refuse_null
from activities.adapters.options import PromptOptions
from projections.domain.chains import MAX_PARENTS
from projections.domain.lifecycle import JobState
from projections.models import Job, Prompt, Response
from projections.rows import JobRow, Timestamp, listed
from projections.writes import RetryChanges

# Shared by a submission and a retry's replacements, so both are validated alike.
PriorityField = Annotated[int, Field(ge=0, le=100), *JSON_INTEGER]
MaxAttemptsField = Annotated[int, Field(ge=1, le=10), *JSON_INTEGER]


def _iso_text(value: Any) -> Any:
    """Lax datetimes would take a number as a Unix time; the wire form is ISO-8601 text."""
    if value is not None and not isinstance(value, str):
        raise PydanticCustomError(
            "datetime_type", "Input should be an ISO-8601 date-time string with an offset"
        )
    return value


def in_utc(value: datetime) -> datetime:
    """`value` in UTC, or the error that says it is out of range (year 1 at +01:00 is in
    year 0 in UTC, which no datetime can hold)."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise PydanticCustomError(
            "datetime_out_of_range", "is out of range: give a time between years 1 and 9999 UTC"
        ) from None


# A time in a body: ISO-8601 text with an offset.
IsoTime = Annotated[AwareDatetime, Strict(False), BeforeValidator(_iso_text)]


# How far ahead a job may be scheduled: well inside Temporal's own cap on a start delay
# (100 years, past which it would start the workflow early, silently).
SCHEDULE_HORIZON = timedelta(days=3653)


# The events a job's own webhook may ask for (projections/webhooks.py JOB_EVENT_TYPES).
JobWebhookEvent = Literal[
    "job.succeeded", "job.failed", "job.cancelled", "job.superseded", "job.running"
]


class SubmitPrompt(BaseModel):
    # One of `prompt` and `messages`, as the OpenAPI document says too.
    model_config = STRICT_BODY | ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}],
            "dependentRequired": {"webhook_events": ["webhook"]},
        }
    )

    # Either may be left out, neither may be null (SkipJsonSchema: the document says so).
    prompt: StrictStr | SkipJsonSchema[None] = Field(
        default=None,
        min_length=1,
        pattern=NO_NUL,
        description="The prompt text, one user message; at most PROMPTJOBS_MAX_PROMPT_BYTES "
        "bytes of UTF-8. Give `prompt` or `messages`",
    )
    messages: Messages | SkipJsonSchema[None] = Field(
        default=None,
        description="A conversation, in the Chat Completions format: roles `system`, "
        "`developer`, `user`, `assistant` (with `tool_calls`), `tool` (with `tool_call_id`); "
        "content a string or parts (`text`, `image_url`). Give `prompt` or `messages`",
    )
    priority: PriorityField = Field(default=50, description="0 is most urgent, 100 least")
    max_attempts: MaxAttemptsField | None = Field(
        default=None, description="Attempts before the job fails; default 3"
    )
    scheduled_for: IsoTime | None = Field(
        default=None,
        description="Start the job at this time (ISO-8601 with offset), at most 10 years "
        "ahead; a time past means now",
    )
    options: PromptOptions = Field(default_factory=PromptOptions)
    parent_id: str | None = Field(default=None, max_length=40, pattern=NO_NUL)
    correlation_id: str | None = Field(default=None, max_length=128, pattern=NO_NUL)
    after: list[Annotated[StrictStr, Field(min_length=1, max_length=40, pattern=NO_NUL)]] = Field(
        default_factory=list,
        max_length=MAX_PARENTS,
        # The OpenAPI document says what _distinct enforces.
        json_schema_extra={"uniqueItems": True},
        description="A chain: prompt ids this prompt runs after, once each one's current job "
        "has succeeded; `{{after[0]}}` or `{{after.<prompt_id>}}` in the prompt is replaced by "
        "that parent's response text",
    )
    webhook: StrictStr | SkipJsonSchema[None] = Field(
        default=None,
        min_length=1,
        max_length=2000,
        pattern=NO_NUL,
        description="A URL told of this job's end (and of a retry's job's), as the org's "
        "endpoints are (docs/webhooks.md): signed with your org's secret for jobs' own "
        "webhooks (`GET /v1/webhooks/default/secret`); https:// (or http://) to a public address",
    )
    webhook_events: (
        Annotated[list[JobWebhookEvent], Field(min_length=1, max_length=5)] | SkipJsonSchema[None]
    ) = Field(
        default=None,
        json_schema_extra={"uniqueItems": True},
        description="The events `webhook` wants; left out: the job's end (`job.succeeded`, "
        "`job.failed`, `job.cancelled`, `job.superseded`). `job.running`: its first attempt "
        "began",
    )

    @field_validator("after")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise PydanticCustomError("after_repeated", "a prompt is listed twice in `after`")
        return value

    @field_validator("scheduled_for")
    @classmethod
    def _within_reach(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if in_utc(value) > datetime.now(UTC) + SCHEDULE_HORIZON:
            raise PydanticCustomError("scheduled_too_far", "must be at most 10 years ahead")
        # As sent, offset and all: an idempotent replay's fingerprint is taken from it.
        return value

    @field_validator("prompt", "messages", "webhook", "webhook_events", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        return refuse_null(value)

    @field_validator("webhook_events")
    @classmethod
    def _events_once(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise PydanticCustomError("event_repeated", "an event is listed twice")
        return value

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> SubmitPrompt:
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError(
                "prompt_or_messages",
                "give `prompt` (one user message) or `messages` (a conversation), not both",
            )
        if self.webhook_events is not None and self.webhook is None:
            raise PydanticCustomError(
                "webhook_events_without_webhook",
                "`webhook_events` names what `webhook` wants: give `webhook` too",
            )
        return self

    def options_as_sent(self) -> dict[str, Any]:
        """The options exactly as the client gave them (what is stored and fingerprinted)."""
        return self.options.model_dump(mode="json", exclude_unset=True)

    def messages_as_sent(self) -> list[dict[str, Any]] | None:
        """The conversation as the client gave it (the fields it set), or None."""
        if self.messages is None:
            return None
        return [m.model_dump(mode="json", exclude_unset=True) for m in self.messages]


class RetryJob(BaseModel):
    """What the new job of a retry runs with instead of the old job's (each optional)."""

    model_config = STRICT_BODY

    options: PromptOptions | None = Field(
        default=None, description="Replaces the old job's options as a whole (not merged)"
    )
    priority: PriorityField | None = Field(default=None, description="0 is most urgent")
    max_attempts: MaxAttemptsField | None = Field(default=None, description="1 to 10")

    def changes(self) -> RetryChanges:
        options = None
        if self.options is not None:
            options = self.options.model_dump(mode="json", exclude_unset=True)
        return RetryChanges(options, self.priority, self.max_attempts)


def request_fields(*models: type[BaseModel]) -> frozenset[str]:
    """Every field name of these request models and the models within them (what a client
    may send), to suggest the one a misspelt field meant."""
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()
    todo = list(models)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            names.add(field.alias or name)
            for inner in _models_in(field.annotation):
                todo.append(inner)
    return frozenset(names)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def unknown_field(name: str, known: Iterable[str]) -> str:
    """The message for a field the model does not have, with the likely one it meant."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    hint = f" (did you mean `{close[0]}`?)" if close else ""
    return f"unknown field: remove it{hint} (see the OpenAPI document for the fields allowed)"


# What a request body may name, anywhere in it: a misspelt field is answered with the one
# it most likely meant (`temprature` → `temperature`).
REQUEST_FIELDS = request_fields(SubmitPrompt, RetryJob)


class JobOut(JobRow):
    webhook: str | None = Field(
        default=None, description="The job's own webhook (its submission's), if any"
    )
    webhook_events: list[str] | None = Field(
        default=None, description="What `webhook` wants; null: the job's end"
    )

    @classmethod
    def of(cls, job: Job) -> JobOut:
        """The whole row: one job's own read, and the answer to acting on it."""
        return cls.model_validate(job)

    @classmethod
    def listed(cls, job: Job) -> JobOut:
        """The row as a listing carries it, the same as an event (long options left out)."""
        return listed(cls.model_validate(job))


class OutputChunk(BaseModel):
    """A piece of a job's streamed output (the data of a `job.output` event): text, and the
    attempt's tool calls as they stand when they have grown."""

    job_id: str
    attempt: int = Field(description="The attempt that streamed it")
    offset: int = Field(description="Where `text` starts in that attempt's output (characters)")
    text: str
    tool_calls: list[ToolCall] | SkipJsonSchema[None] = Field(
        default=None,
        description="Present when the attempt's tool calls grew: each call so far, whole (its "
        "id, its function's name, its arguments' JSON text so far, which the next snapshot "
        "only lengthens). Left out when they did not grow.",
    )

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _stored_calls(cls, value: Any) -> Any:
        # The event log keeps a call flat (id, name, arguments), as a response row does.
        if isinstance(value, list) and value and "function" not in value[0]:
            return tool_calls_out(value)
        return value


class OutputReset(BaseModel):
    """The data of a `job.output_reset` event: drop the text of earlier attempts."""

    job_id: str
    attempt: int = Field(description="The new attempt, whose text follows from offset 0")


class OutputOut(OutputChunk):
    """`GET /v1/jobs/{id}/output`: the current attempt's text from an offset on, and its tool
    calls so far."""

    tool_calls: list[ToolCall] | None = Field(
        default=None,
        description="The attempt's tool calls so far, whole (arguments so far); null: none",
    )

    done: bool = Field(
        description="The job has settled and its last attempt has written all it streamed: "
        "no more text will come"
    )


class AttemptOut(BaseModel):
    """One attempt of a job: how it ended and what it consumed."""

    model_config = ConfigDict(from_attributes=True)

    attempt: int
    outcome: str = Field(description="succeeded, cancelled, or the error kind it failed with")
    provider: str
    model: str
    input_tokens: int | None
    output_tokens: int | None
    usage_estimated: bool = Field(
        description="The counts are ours (counted or estimated), not the provider's"
    )
    cost_usd: float | None = Field(description="null: the model has no price")
    output_chars: int = Field(description="Characters of text the attempt streamed")
    first_token_ms: int | None = Field(description="From the call's start to its first text")
    duration_ms: int
    started_at: Timestamp
    ended_at: Timestamp
    via: str | None = Field(
        default=None,
        description="How the call was made where it was not one direct call: the provider "
        "batch it ran in, or why a deferrable job ran directly",
    )
    errors: list[SchemaErrorOut] | None = Field(
        default=None,
        description="A `schema_mismatch` attempt's validation errors (its answer went back "
        "to the model with them, as the next attempt's repair turn)",
    )
    moved_on: str | None = Field(
        default=None,
        description="Why the next attempt ran at the job's next place (`options.fallbacks`): "
        "this attempt's failure moved the job on",
    )


class SchemaErrorOut(BaseModel):
    path: str = Field(description="Where in the answer, as a JSON pointer (`/` the whole)")
    message: str


class AttemptList(BaseModel):
    job_id: str
    attempts: list[AttemptOut]


class Accepted(BaseModel):
    prompt_id: str
    job_id: str
    state: JobState


class JobList(BaseModel):
    jobs: list[JobOut]
    next_cursor: str = Field(description="Pass as `since` to get the jobs changed after these")


class PromptOut(BaseModel):
    prompt_id: str
    prompt: str = Field(description="The prompt, or a conversation's transcript (a line a message)")
    messages: list[dict[str, Any]] | None = Field(
        description="The conversation as sent; null for a prompt given as text"
    )
    author: str
    options: dict[str, Any]
    parent_id: str | None
    correlation_id: str | None
    after: list[str] = Field(description="The prompts this one runs after (its parents)")
    children: list[str] = Field(description="The prompts that run after this one, you can see")
    created_at: datetime
    jobs: list[JobOut] = Field(
        description="Its jobs, oldest first, the last the current one: every job on the "
        "prompt's own page, the newest 10 in a listing"
    )
    job_count: int = Field(description="How many jobs the prompt has had (retries included)")

    @classmethod
    def of(
        cls, prompt: Prompt, jobs: list[Job], children: list[str], job_count: int | None = None
    ) -> PromptOut:
        return cls(
            prompt_id=prompt.prompt_id,
            prompt=prompt.text,
            messages=prompt.messages,
            author=prompt.author,
            options=prompt.options,
            parent_id=prompt.parent_id,
            correlation_id=prompt.correlation_id,
            after=list(prompt.after or []),
            children=children,
            created_at=prompt.created_at,
            jobs=[JobOut.listed(job) for job in jobs],
            job_count=len(jobs) if job_count is None else job_count,
        )


class PromptList(BaseModel):
    prompts: list[PromptOut] = Field(description="Newest first, by when the prompt was submitted")
    next_before: str | None = Field(
        description="Pass as `before` for the next (older) page; null on the last page"
    )
    cursor: str = Field(
        description="The event cursor as of this read: pass it as `since` to `GET /v1/events` "
        "or `GET /v1/jobs` to follow every change made after it"
    )


class Usage(BaseModel):
    input_tokens: int | None
    output_tokens: int | None
    usage_estimated: bool = Field(
        description="The counts are ours (counted or estimated), not the provider's"
    )
    cost_usd: float | None = Field(
        description="By the workers' price table, in US dollars; null when the model has no price"
    )


class ResponseOut(BaseModel):
    """A response row: every field of `AttemptResult` (the tokens grouped as `usage`) and where
    it belongs. tests/unit/test_api_validation.py fails if AttemptResult gains a field that
    is not here, so a new result field cannot be left out of the API."""

    response_id: str
    job_id: str
    prompt_id: str
    text: str
    tool_calls: list[ToolCall] | None = Field(
        description="The calls the model asks for (null: none), as an assistant message carries "
        "them: run them, then send their results as `tool` messages in the next job"
    )
    output_json: Any = Field(
        default=None,
        description="The answer parsed as JSON, validated against the job's "
        "`options.output_schema` (null: the job has none, or answered with tool calls)",
    )
    provider: str
    model: str
    provider_request_id: str | None
    finish_reason: str | None = Field(
        description="`stop`, `length` (max_tokens), `tool_calls`, `content_filter`, or the "
        "provider's own word"
    )
    usage: Usage
    latency_ms: int | None
    first_token_ms: int | None = Field(description="From the call's start to its first text")
    attempt: int
    created_at: datetime

    @classmethod
    def of(cls, response: Response) -> ResponseOut:
        values = {
            name: getattr(response, name)
            for name in cls.model_fields
            if name not in ("usage", "tool_calls") and name not in USAGE_FIELDS
        }
        usage = Usage(**{name: getattr(response, name) for name in USAGE_FIELDS})
        return cls(**values, usage=usage, tool_calls=tool_calls_out(response.tool_calls))


def tool_calls_out(stored: list[dict[str, str]] | None) -> list[ToolCall] | None:
    """A response's tool calls as an assistant message carries them."""
    if not stored:
        return None
    return [
        ToolCall.model_construct(
            id=call["id"],
            type="function",
            function=FunctionCall.model_construct(name=call["name"], arguments=call["arguments"]),
        )
        for call in stored
    ]


# AttemptResult's fields that ResponseOut groups under `usage`.
USAGE_FIELDS = tuple(Usage.model_fields)


class Health(BaseModel):
    status: str = Field(description="`ok` while the process serves requests")


class Readiness(BaseModel):
    status: str = Field(description="`ready`, or `not_ready` when a dependency is unreachable")
    checks: dict[str, str] = Field(description="`database` and `temporal`: `ok` or why not")


class SpendOut(BaseModel):
    """What some attempts consumed: all of a period's, or one model's, or one user's."""

    provider: str | None = Field(default=None, description="The model's provider (by model)")
    model: str | None = Field(default=None, description="The model asked for (by model)")
    user: str | None = Field(default=None, description="Who submitted the jobs (by user)")
    key_id: str | None = Field(
        default=None, description="The API key that submitted the jobs (by key; null: none)"
    )
    attempts: int
    input_tokens: int
    output_tokens: int
    cost_usd: float = Field(description="US dollars, by the price table")
    unpriced_attempts: int = Field(
        description="Attempts on a model the price table does not price: not in `cost_usd`"
    )


class SpendPeriod(SpendOut):
    since: Timestamp = Field(description="The period's start (UTC midnight, or the month's first)")
    by_model: list[SpendOut]
    by_user: list[SpendOut] | None = Field(
        default=None, description="Per user who submitted (an admin's view; null for a member)"
    )
    by_key: list[SpendOut] = Field(description="Per API key that submitted the jobs")


class CapOut(BaseModel):
    """A spend cap the caller's jobs count against, and what its UTC day has used of it."""

    key_id: str | None = Field(description="The key's own cap; null: the org's")
    usd_per_day: float
    spent_usd: float = Field(description="By attempts that ended today (UTC)")
    held_usd: float = Field(description="Held by calls in flight (what they may cost)")
    resets_at: Timestamp = Field(description="When the cap's day turns (midnight UTC)")


class UsageOut(BaseModel):
    org: str
    user: str | None = Field(
        default=None, description="A member's own spend: their user; null: the whole org's"
    )
    today: SpendPeriod
    month: SpendPeriod
    caps: list[CapOut] = Field(
        description="The spend caps your jobs count against (`promptjobs orgs limit "
        "--usd-per-day`): your org's, and your key's own"
    )


# -- webhooks ------------------------------------------------------------------------------

WebhookEvent = Literal[
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.superseded",
    "job.running",
    "response.completed",
    "response.failed",
    "response.cancelled",
    "response.incomplete",
    "batch.completed",
    "batch.failed",
    "batch.cancelled",
    "batch.expired",
]


class WebhookIn(BaseModel):
    """A webhook endpoint to create (an admin key: the org's)."""

    model_config = STRICT_BODY

    url: Annotated[str, StringConstraints(min_length=1, max_length=2000)] = Field(
        description="Where deliveries go: https:// (or http://) to a public address"
    )
    events: list[WebhookEvent] = Field(
        default_factory=list,
        max_length=10,
        description="The event types it wants; empty: every end (a job's `job.…`, a "
        "background response's `response.…`, a batch's `batch.…`). `job.running` (a job's "
        "first attempt began) only if named",
    )
    description: Annotated[str, StringConstraints(max_length=255)] | None = None


class WebhookChange(BaseModel):
    """What to change of an endpoint; what is left out stays."""

    model_config = STRICT_BODY

    url: Annotated[str, StringConstraints(min_length=1, max_length=2000)] | None = None
    events: list[WebhookEvent] | None = Field(default=None, max_length=10)
    description: Annotated[str, StringConstraints(max_length=255)] | None = None
    enabled: bool | None = Field(
        default=None, description="true enables a disabled endpoint again; false disables it"
    )


class RotateIn(BaseModel):
    model_config = STRICT_BODY

    overlap_s: Annotated[int, *JSON_INTEGER] = Field(
        default=86_400,
        ge=0,
        le=7 * 86_400,
        description="How long the previous secret keeps signing too (both signatures sent)",
    )


class RedeliverIn(BaseModel):
    model_config = STRICT_BODY

    delivery_id: str | None = Field(default=None, description="One delivery to send again")
    since: Annotated[IsoTime, AfterValidator(in_utc)] | None = Field(
        default=None, description="Else every failed delivery made since this time (or ever)"
    )


class WebhookOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    endpoint_id: str
    url: str
    events: list[str]
    description: str | None
    enabled: bool
    disabled_reason: str | None = Field(
        description="Why deliveries stopped: 410 Gone, failing for days, or the org's choice"
    )
    created_at: Timestamp
    updated_at: Timestamp


class WebhookWithSecret(WebhookOut):
    secret: str = Field(
        description="The signing secret (`whsec_…`), shown only when made or rotated: keep it"
    )


class WebhookList(BaseModel):
    data: list[WebhookOut]


class SigningSecret(BaseModel):
    """The secret that signs your org's jobs' own webhooks (a submission's `webhook`)."""

    key: str = Field(description="The signing secret (`whsec_…`)")
    previous_until: Timestamp | None = Field(
        description="After a rotation: until when the previous secret signs too"
    )


class DeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    delivery_id: str = Field(description="Its `webhook-id`: the same on every try")
    event_type: str
    job_id: str | None
    url: str | None = Field(
        description="Where a job's own webhook goes (`/v1/webhooks/default/deliveries`); null "
        "for an endpoint's"
    )
    state: str = Field(description="pending, delivered or failed")
    attempts: int
    last_status: int | None = Field(description="The receiver's last HTTP status, if any")
    last_error: str | None
    created_at: Timestamp = Field(description="When the state change it tells of happened")
    last_attempt_at: Timestamp | None
    delivered_at: Timestamp | None


class DeliveryList(BaseModel):
    data: list[DeliveryOut]


class Redelivered(BaseModel):
    delivery_ids: list[str]
