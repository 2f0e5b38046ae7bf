"""The dataclasses that cross Temporal between PromptJobWorkflow and its activities.

One parameter per activity, so a field can be added without breaking recorded histories.
Prompt text never enters workflow history: the activity reads it from the projection.
"""

from __future__ import annotations

from dataclasses import dataclass

from projections.domain.lifecycle import AttemptResult, ErrorKind, JobState


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
    # The job must hold one of its org's running slots before its first attempt starts
    # (projections/admission.py); without one the activity fails ORG_BUSY and changes
    # nothing. Set by workflows started since the patch `org-running-limit`.
    admission: bool = False
    # The call must fit its provider budget (projections/budgets.py) before it starts, and a
    # 429 pauses the budget instead of spending the attempt: either way the activity fails
    # PROVIDER_BUSY and the workflow waits. Set by workflows since the patch `provider-budgets`.
    budget: bool = False
    # A deferrable job that runs directly: why (its attempt records say it).
    via: str = ""


@dataclass
class SettleResult:
    applied: bool
    state: JobState
    response_id: str | None = None
    # The row as it now stands (older activities did not return these).
    attempt: int | None = None
    error_kind: ErrorKind | None = None
    error_message: str | None = None


@dataclass(frozen=True)
class AdapterOutcome(AttemptResult):
    """One attempt's result as the call_adapter activity returns it: the adapter's result
    (flat, as histories recorded before this class existed hold it) and the attempt."""

    attempt: int = 0
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
    state: JobState
    error_kind: ErrorKind | None = None
    error_message: str | None = None


@dataclass
class AttemptReport:
    """Sent by an attempt to its own workflow so the Web UI's search attributes stay current."""

    state: JobState
    attempt: int
    error_kind: ErrorKind | None = None


@dataclass
class CheckParents:
    job_id: str


@dataclass
class ParentsCheck:
    """A chain's child: the parent prompts whose current job has not succeeded, and why (for
    the Web UI and, past the ceiling, the job's error message)."""

    waiting_on: list[str]
    detail: str = ""


# The ApplicationError type an attempt raises when the job is already settled (cancelled
# before it started, failed `stuck` by the reconciler): nothing to run, nothing to retry.
# Its details are the row's state, error kind and error message.
JOB_CLOSED = "job_closed"

# The signal an attempt sends to its workflow (PromptJobWorkflow.attempt_reported).
ATTEMPT_REPORTED = "attempt_reported"

# The signal a chain's child gets when one of its parents succeeded: check them again.
PARENTS_CHANGED = "parents_changed"

# The ApplicationError type an attempt raises when its job's org has no free running slot:
# nothing was changed, the job stays queued, and its workflow waits for SLOT_FREED (or its
# re-check timer) before trying again. Its details are the org's running count and limit.
ORG_BUSY = "org_busy"

# The signal a job waiting for a slot gets when its org has room (sent by the dispatcher).
# A job waiting for provider capacity gets it too, when its budget has room: ask again.
SLOT_FREED = "slot_freed"

# The ApplicationError type an attempt raises when its provider budget has no room now, or
# the provider answered 429 (the budget is paused): the job is queued, no attempt is spent,
# and its workflow waits for SLOT_FREED or its timer before asking again. Its details are
# the number of the attempt the 429 ended (None: no call was made) and the seconds until
# the room is expected.
PROVIDER_BUSY = "provider_busy"
# The type of a client error (its kind not retried in place) that moves the job on to its
# next place (`options.fallbacks`): Temporal retries it there.
MOVED_ON = "moved_on"


@dataclass
class ArchiveExpired:
    """What the retention schedule asks of each run (shown in the Web UI's Schedules page)."""

    # Terminal jobs finished longer ago than this are removed, as `promptjobs jobs archive`.
    retention_days: float
    # Jobs removed per transaction: each holds the projection's write lock briefly.
    batch: int = 500


@dataclass
class ArchiveReport:
    jobs: int = 0
    events: int = 0
    prompts: int = 0
    responses: int = 0
    before: str = ""
    # Files, `/v1/batches`, provider batches and webhook deliveries removed with them
    # (Operations.archive_storage).
    files: int = 0
    batches: int = 0
    provider_batches: int = 0
    webhook_deliveries: int = 0


# -- deferrable jobs and provider batches (issue 33) -----------------------------------------


@dataclass
class DeferJob:
    job_id: str


@dataclass
class Deferral:
    """Whether the job waits for a provider batch; if not, why it runs directly (its
    attempt record says so)."""

    deferred: bool
    reason: str = ""


# The signal a deferred job's workflow gets once its provider batch is done with it.
BATCH_DONE = "batch_done"


@dataclass
class BatchVerdict:
    """What a provider batch did with a job. `settled`: the row is settled (succeeded or
    failed) and the workflow ends as it says. Otherwise the job runs directly, after
    `delay_s`: `attempt` attempts are made, `spared` of them not charged (a 429 line, a line
    the provider never ran), and `via` says why on its attempt record."""

    settled: bool
    state: JobState
    attempt: int
    spared: int = 0
    delay_s: float = 0.0
    via: str = ""
    response_id: str | None = None
    error_kind: ErrorKind | None = None
    error_message: str | None = None


@dataclass
class ProviderBatchRef:
    batch_id: str


@dataclass
class BatchSent:
    """A provider batch was sent (`provider_batch_id`), or is not: none of its jobs is
    queued any more (`empty`), or they run directly (`direct`: why)."""

    provider_batch_id: str | None = None
    empty: bool = False
    direct: str = ""


@dataclass
class BatchPoll:
    status: str
    ended: bool


@dataclass
class BatchSettled:
    settled: int = 0
    direct: int = 0
    # Result lines that named no job, and repeated lines (ProviderBatch's counts).
    unreadable: int = 0
    duplicates: int = 0
