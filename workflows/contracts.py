"""The dataclasses that cross Temporal between the starters (the API, the projection's
commits) and the workflows, and the one PromptJobWorkflow keeps for itself (`Direct`).

They live outside workflows/prompt_job.py so that the workflow sandbox passes them through
instead of re-creating them for every workflow run (building a dataclass is not cheap, and
the sandbox re-imports the workflow's own module per run). Add fields only with defaults:
recorded histories carry the old shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from projections.domain.lifecycle import ErrorKind, JobState


@dataclass
class PromptJobInput:
    job_id: str
    prompt_id: str
    org: str
    max_attempts: int
    priority: int = 50
    # The hard ceiling: past it the job fails as `stuck`.
    ceiling_s: float = 900.0
    # One adapter call's limit, beyond the adapter's own timeout.
    attempt_timeout_s: float = 300.0
    # A worker silent for this long is presumed dead and the attempt runs elsewhere.
    heartbeat_timeout_s: float = 10.0
    # A chain: the parent prompts to wait for (each one's current job succeeded) first.
    after: list[str] = field(default_factory=list)
    # Attempts an earlier workflow of this job already made (the reconciler restarts a lost
    # workflow): this one continues the count, so its first attempt is `attempts_before + 1`.
    attempts_before: int = 0
    # `options.deferrable`: the job may wait for a provider batch (issue 33).
    deferrable: bool = False


@dataclass
class PromptJobResult:
    job_id: str
    state: JobState
    response_id: str | None = None
    error_kind: ErrorKind | None = None
    error_message: str | None = None


@dataclass
class ProviderBatchInput:
    """A provider batch's workflow (workflows/provider_batch.py); its id is `batch_id`."""

    batch_id: str
    # How long between two looks at the provider's status.
    poll_s: float = 60.0


@dataclass(frozen=True)
class Direct:
    """How a job's direct attempts begin: `made` attempts before them, `spared` of which
    are not charged; `via`: why a deferrable job runs directly (its attempt records say).
    The workflow's own: it never crosses Temporal."""

    made: int
    spared: int = 0
    via: str = ""


@dataclass(frozen=True)
class WebhookDeliveryInput:
    delivery_id: str
    # The wait before the second try (PROMPTJOBS_WEBHOOK_FIRST_RETRY_S); each next is three
    # times longer, up to `longest_wait_s` (PROMPTJOBS_WEBHOOK_LONGEST_WAIT_S).
    first_retry_s: float = 5.0
    longest_wait_s: float = 6 * 60 * 60.0
    # The receiver's read timeout (PROMPTJOBS_WEBHOOK_TIMEOUT_S): a try lost with its worker
    # is made again once this and the records' time have passed.
    timeout_s: float = 10.0
