"""The job lifecycle's one vocabulary: the six states and their transitions, the error kinds,
which kinds are retried and when, and the decision a failed attempt leads to.

Pure: it imports nothing of ours and does no I/O, so the workflow (inside Temporal's sandbox),
the activities, the adapters, the projector, the API and the CLI all decide by the same code.
A state or an error kind is spelled as a string only here and in the schema's migrations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

# -- states --------------------------------------------------------------------------------


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"

    @property
    def shows_error(self) -> bool:
        """Whether a row in this state shows its error: a re-queue says why, a failure too;
        a row running its next attempt still holds the last error, which is not this state's."""
        return self in (JobState.QUEUED, JobState.FAILED)

    @property
    def is_terminal(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)

    def is_cancelable(self) -> bool:
        return not self.is_terminal

    def is_retryable_by_user(self) -> bool:
        """A user retry makes a new job; only a settled, not yet superseded job can be replaced."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


UNSETTLED = (JobState.QUEUED, JobState.RUNNING)
TERMINAL = tuple(state for state in JobState if state.is_terminal)


# -- error kinds ---------------------------------------------------------------------------


class ErrorKind(StrEnum):
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    PROVIDER_5XX = "provider_5xx"
    PROVIDER_4XX = "provider_4xx"
    PARSE = "parse"
    AUTH = "auth"
    WORKER_CRASH = "worker_crash"
    STUCK = "stuck"
    # The answer does not match the job's JSON schema (options.output_schema): the next
    # attempt is sent a repair turn (activities/adapters/structured.py).
    SCHEMA_MISMATCH = "schema_mismatch"
    UNKNOWN = "unknown"

    @property
    def is_retryable(self) -> bool:
        return self in RETRYABLE


RETRYABLE = frozenset(
    {
        ErrorKind.TIMEOUT,
        ErrorKind.RATE_LIMIT,
        ErrorKind.PROVIDER_5XX,
        ErrorKind.WORKER_CRASH,
        ErrorKind.SCHEMA_MISMATCH,
        ErrorKind.UNKNOWN,
    }
)

# The ApplicationError types Temporal must not retry (an attempt's error type is its kind).
NON_RETRYABLE_TYPES = tuple(kind.value for kind in ErrorKind if not kind.is_retryable)


def kind_of_error_type(error_type: str | None) -> ErrorKind | None:
    """The kind an ApplicationError's `type` names, if it names one."""
    try:
        return ErrorKind(error_type) if error_type is not None else None
    except ValueError:
        return None


# Which of Temporal's activity timeouts (TimeoutType names, lower case) means what for a job.
TIMEOUT_KINDS: Mapping[str, tuple[ErrorKind, str]] = MappingProxyType(
    {
        "heartbeat": (ErrorKind.WORKER_CRASH, "the worker stopped heartbeating during the call"),
        "schedule_to_close": (ErrorKind.STUCK, "the job passed its hard ceiling"),
        "start_to_close": (ErrorKind.TIMEOUT, "the adapter call passed its time limit"),
    }
)


# -- transitions ---------------------------------------------------------------------------

ALLOWED_TRANSITIONS: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.QUEUED, JobState.CANCELLED),
        # Only for the hard ceiling passing while no worker ran the job (ErrorKind.STUCK);
        # see docs/decisions.md.
        (JobState.QUEUED, JobState.FAILED),
        (JobState.RUNNING, JobState.SUCCEEDED),
        (JobState.RUNNING, JobState.QUEUED),
        (JobState.RUNNING, JobState.FAILED),
        (JobState.RUNNING, JobState.CANCELLED),
        (JobState.SUCCEEDED, JobState.SUPERSEDED),
        (JobState.FAILED, JobState.SUPERSEDED),
        (JobState.CANCELLED, JobState.SUPERSEDED),
    }
)


def is_allowed(current: JobState, target: JobState, error_kind: ErrorKind | None = None) -> bool:
    if (current, target) not in ALLOWED_TRANSITIONS:
        return False
    if (current, target) == (JobState.QUEUED, JobState.FAILED):
        return error_kind is ErrorKind.STUCK
    return True


def sources_of(target: JobState, error_kind: ErrorKind | None = None) -> tuple[JobState, ...]:
    """The states a job may be in for `target` to apply: the projector's `state IN (...)`."""
    return tuple(state for state in JobState if is_allowed(state, target, error_kind))


def progress_rank(state: JobState, attempt: int) -> int:
    """Order of non-terminal transitions within a job, so a late or repeated one is a no-op.

    Attempt *n* starts (running, rank 2n) and, when it fails with attempts left, re-queues
    (queued, rank 2n+1). The initial queued row is attempt 0, rank 1. Terminal states are
    absorbing, so they need no rank of their own.
    """
    if state is JobState.RUNNING:
        return 2 * attempt
    return 2 * attempt + 1


# -- the event log --------------------------------------------------------------------------


class EventType(StrEnum):
    """What a row of the job event log (the SSE and polling cursor's log) records."""

    # An applied transition; data: the job row after it.
    STATE_CHANGED = "job.state_changed"
    # A batch of the current attempt's streamed text; data: {job_id, attempt, offset, text}.
    OUTPUT = "job.output"
    # A new attempt started after an earlier one streamed text: drop it; data: {job_id,
    # attempt} (the new attempt).
    OUTPUT_RESET = "job.output_reset"
    # An attempt's usage was recorded after its job settled (a cancelled call's last tokens);
    # data: the job row with its new sums. Before settling, the next transition carries it.
    USAGE = "job.usage"
    # The job's run is over and its record complete: it has settled, and its last attempt's
    # text and usage are written (they may land after the settling transition, as a cancelled
    # call's do). A job's last event, but for a `superseded` if it is retried later; data:
    # the job row.
    DONE = "job.done"

    @property
    def carries_row(self) -> bool:
        """Whether the event's data is a job row (else an output payload)."""
        return self in (EventType.STATE_CHANGED, EventType.USAGE, EventType.DONE)


# The states in which the current attempt's streamed text may still grow: running, and the
# last moments of an attempt that was cancelled or failed mid-stream (its final batch lands
# after the row settled).
OUTPUT_STATES = (JobState.RUNNING, JobState.CANCELLED, JobState.FAILED)


# -- what a failed attempt leads to ------------------------------------------------------


@dataclass(frozen=True)
class BackoffPolicy:
    """When the next attempt runs. Defaults: 5 s, 25 s, 125 s ± 20 %."""

    initial_s: float = 5.0
    coefficient: float = 5.0
    maximum_s: float = 600.0
    jitter: float = 0.2
    rate_limit_default_s: float = 60.0
    # Temporal clamps retry intervals under one second to one second.
    minimum_s: float = 1.0

    def delay_s(
        self,
        kind: ErrorKind,
        failed_attempt: int,
        *,
        retry_after_s: float | None,
        unit_random: float,
    ) -> float:
        """The wait after attempt `failed_attempt` (1-based) failed; `unit_random` is in [0, 1)."""
        if kind in (ErrorKind.WORKER_CRASH, ErrorKind.SCHEMA_MISMATCH):
            return self.minimum_s  # at once: nothing to wait out
        if kind is ErrorKind.RATE_LIMIT:
            # The provider's word wins, however short; we add no jitter to an explicit date.
            if retry_after_s is not None:
                return max(self.minimum_s, retry_after_s)
            base = self.rate_limit_default_s
        else:
            base = min(self.maximum_s, self.initial_s * self.coefficient ** (failed_attempt - 1))
        spread = 1.0 + self.jitter * (2.0 * unit_random - 1.0)
        delay = base * spread
        if kind is ErrorKind.RATE_LIMIT:
            delay = max(delay, self.rate_limit_default_s)
        return max(self.minimum_s, delay)


@dataclass(frozen=True)
class Retry:
    """Run another attempt after `delay_s`; meanwhile the job is queued. `moved_on`: why
    that attempt runs at the job's next place (`options.fallbacks`), or None."""

    delay_s: float
    moved_on: str | None = None


# Failures that say the provider is out rather than that the request is wrong: with a place
# to move to, a job moves on after OUTAGE_STREAK of them in a row at one place (the first
# is retried there: most outages are blips).
OUTAGE_KINDS = frozenset({ErrorKind.PROVIDER_5XX, ErrorKind.TIMEOUT})
OUTAGE_STREAK = 2


class Reason(StrEnum):
    """What a provider's client error says, where moving elsewhere can cure it (a failure
    of kind `provider_4xx`, which is not retried in the same place)."""

    CONTEXT_LENGTH = "context_length"  # the request is over the model's window
    MODEL_GONE = "model_gone"  # the provider does not serve the model (any more)


@dataclass(frozen=True)
class End:
    """No further attempt: the job ends `failed` with this kind and message."""

    kind: ErrorKind
    message: str
    state: JobState = JobState.FAILED


@dataclass(frozen=True)
class FailedAttempt:
    """What the decision needs to know about one failed attempt."""

    kind: ErrorKind
    message: str
    attempt: int
    max_attempts: int
    retry_after_s: float | None = None
    # Moving on: whether the job has another place to run, the provider's reason for a
    # client error, and how many outage failures in a row this place has given the job.
    elsewhere: bool = False
    reason: Reason | None = None
    outage_streak: int = 0


def moves_on(failure: FailedAttempt) -> str | None:
    """Why the job's next attempt runs at its next place, or None: the policy table's
    fallback column (docs/decisions.md). A busy provider (a 429, a full budget) is not here:
    waiting is its cure, and the workflow waits without spending an attempt."""
    if not failure.elsewhere:
        return None
    if failure.reason is Reason.CONTEXT_LENGTH:
        return "the request is over the model's context window"
    if failure.reason is Reason.MODEL_GONE:
        return "the provider does not serve the model"
    if failure.kind in OUTAGE_KINDS and failure.outage_streak >= OUTAGE_STREAK:
        return f"the provider failed {failure.outage_streak} times in a row ({failure.kind})"
    return None


def next_step(
    failure: FailedAttempt,
    *,
    policy: BackoffPolicy,
    now_s: float,
    deadline_s: float,
    unit_random: float,
) -> Retry | End:
    """The one place that decides whether a failed attempt is retried, and when, or how the
    job ends: not retryable or attempts spent → failed with the attempt's kind; a next
    attempt that would start at or after the hard ceiling (`deadline_s`, like `now_s` in
    epoch seconds) → failed as `stuck`; else retried after the policy's delay. A failure
    that moves the job to its next place (`moves_on`) is retried there at once, whatever
    its kind."""
    moved_on = moves_on(failure)
    if failure.attempt >= failure.max_attempts or not (failure.kind.is_retryable or moved_on):
        return End(failure.kind, failure.message)
    delay = (
        policy.minimum_s
        if moved_on
        else policy.delay_s(
            failure.kind,
            failure.attempt,
            retry_after_s=failure.retry_after_s,
            unit_random=unit_random,
        )
    )
    if now_s + delay >= deadline_s:
        return End(
            ErrorKind.STUCK,
            "the next attempt would start after the job's hard ceiling; last error "
            f"({failure.kind.value}): {failure.message}",
        )
    return Retry(delay, moved_on)


def lost_attempt_message(attempt: int, worker: str | None) -> str:
    """Why attempt `attempt` is recorded as a worker_crash when the next one starts."""
    return f"attempt {attempt} lost its worker ({worker or 'unknown'}): no heartbeat"


# -- what an attempt produced -------------------------------------------------------------


@dataclass(frozen=True)
class AttemptResult:
    """What a successful adapter call produced: the adapter returns it, the attempt carries it
    to the projection, and the projection stores it as the response row. A new field (usage,
    cost, …) is added here, and to the `responses` table."""

    text: str
    provider: str
    model: str
    provider_request_id: str | None = None
    # Why the model stopped, the same words on every provider (FINISH_REASONS), else the
    # provider's own.
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_ms: int | None = None
    # From the call's start to its first streamed text.
    first_token_ms: int | None = None
    # The token counts are ours (counted or estimated), not the provider's.
    usage_estimated: bool = False
    # What the attempt cost by the worker's price table; None when the model has no price.
    cost_usd: float | None = None
    # The calls the model asked for, in order: each {"id", "name", "arguments"} (the arguments
    # as JSON text, as the model wrote them); None: none. Plain JSON, as histories hold it.
    tool_calls: list[dict[str, str]] | None = None
    # The answer's JSON, validated against the job's output_schema; None: no schema (or an
    # answer of tool calls).
    output_json: Any = None


# Why a model stopped: its answer was whole; it reached max_tokens; it asked for tools; a
# filter cut it. Each adapter says its provider's reasons in these words.
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")
