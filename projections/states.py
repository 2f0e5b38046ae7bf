"""The six job states and the only transitions between them."""

from __future__ import annotations

from enum import StrEnum


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

    def is_cancelable(self) -> bool:
        return not self.is_terminal

    def is_retryable_by_user(self) -> bool:
        """A user retry makes a new job; only a settled, not yet superseded job can be replaced."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


ALLOWED_TRANSITIONS: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.QUEUED, JobState.CANCELLED),
        # Only for the hard ceiling passing while no worker ran the job (error_kind "stuck");
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

STUCK_ERROR_KIND = "stuck"


def is_allowed(current: JobState, target: JobState, error_kind: str | None = None) -> bool:
    if (current, target) not in ALLOWED_TRANSITIONS:
        return False
    if (current, target) == (JobState.QUEUED, JobState.FAILED):
        return error_kind == STUCK_ERROR_KIND
    return True


def progress_rank(state: JobState, attempt: int) -> int:
    """Order of non-terminal transitions within a job, so a late or repeated one is a no-op.

    Attempt *n* starts (running, rank 2n) and, when it fails with attempts left, re-queues
    (queued, rank 2n+1). The initial queued row is attempt 0, rank 1. Terminal states are
    absorbing, so they need no rank of their own.
    """
    if state is JobState.RUNNING:
        return 2 * attempt
    return 2 * attempt + 1
