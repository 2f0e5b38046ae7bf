"""The dataclasses that cross Temporal between PromptJobWorkflow and its activities.

One parameter per activity, so a field can be added without breaking recorded histories.
Prompt text never enters workflow history: the activity reads it from the projection.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdapterCall:
    job_id: str
    max_attempts: int
    # Epoch seconds of the job's hard ceiling; an attempt that would start later is not made.
    deadline_epoch_s: float
    # Settle a success in the same activity (persist the response, mark the job succeeded)
    # instead of leaving it to finalize_success. Set by workflows started since the patch
    # `settle-success-in-call`; older histories call finalize_success.
    settle_success: bool = False
    # Attempts an earlier workflow of the job made (PromptJobInput.attempts_before): Temporal
    # counts this workflow's attempts from 1, the job's count continues from here.
    attempt_offset: int = 0


@dataclass
class SettleResult:
    applied: bool
    state: str
    response_id: str | None = None
    # The row as it now stands (older activities did not return these).
    attempt: int | None = None
    error_kind: str | None = None
    error_message: str | None = None


@dataclass
class AdapterOutcome:
    attempt: int
    text: str
    provider: str
    model: str
    provider_request_id: str | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_ms: int | None = None
    # Set when the activity settled the job itself (AdapterCall.settle_success): what the
    # projection now holds. An attempt retried after its success was committed, but whose
    # completion Temporal lost, returns the settlement it finds (with no text).
    settled: SettleResult | None = None


@dataclass
class FinalizeSuccess:
    job_id: str
    outcome: AdapterOutcome


@dataclass
class SettleJob:
    """A terminal transition the workflow decided: failed (with its kind) or cancelled."""

    job_id: str
    state: str
    error_kind: str | None = None
    error_message: str | None = None


@dataclass
class AttemptReport:
    """Sent by an attempt to its own workflow so the Web UI's search attributes stay current."""

    state: str
    attempt: int
    error_kind: str | None = None


# The ApplicationError type an attempt raises when the job is already settled (cancelled
# before it started, failed `stuck` by the reconciler): nothing to run, nothing to retry.
# Its details are the row's state, error kind and error message.
JOB_CLOSED = "job_closed"

# The signal an attempt sends to its workflow (PromptJobWorkflow.attempt_reported).
ATTEMPT_REPORTED = "attempt_reported"
