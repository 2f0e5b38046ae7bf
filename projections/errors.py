"""The domain's refusals, raised by the projection and services, rendered once by the API
(api/problems.py) and once by the CLI."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from projections.domain.errors import Refused
from projections.domain.lifecycle import JobState


def database_unavailable(err: BaseException) -> bool:
    """The projection database could not be reached or is locked (PostgreSQL down or
    restarting, a dropped connection, SQLite busy past its timeout): an outage of the
    infrastructure, to wait out and retry, never a verdict on the job or request at hand."""
    if isinstance(err, OperationalError | InterfaceError):
        return True
    return isinstance(err, DBAPIError) and err.connection_invalidated


class NotFound(Refused, LookupError):
    """No `what` with this id is visible to the caller (another org's is not found either)."""

    code = "not_found"

    def __init__(self, what: str, ident: str) -> None:
        super().__init__(f"no {what} {ident!r}")
        self.what = what
        self.ident = ident


class InvalidState(Refused):
    """The job is not in a state that allows the action (cancel a settled job, retry a live one)."""

    code = "invalid_state"

    def __init__(self, job_id: str, state: JobState, action: str) -> None:
        # Values, not the row: the transaction that raised this rolls back and expires it.
        self.job_id = job_id
        self.state = state
        self.action = action
        super().__init__(f"job {job_id} is {state.value}; cannot {action} it")


class RetryLimit(Refused):
    """The prompt has had as many jobs as one prompt may (`max_jobs_per_prompt`)."""

    code = "retry_limit"

    def __init__(self, job_id: str, prompt_id: str, limit: int) -> None:
        self.job_id = job_id
        self.prompt_id = prompt_id
        self.limit = limit
        super().__init__(
            f"prompt {prompt_id} has had {limit} jobs, as many as one prompt may; submit the "
            "prompt again as a new one to run it once more"
        )


class IdempotencyConflict(Refused):
    """The same Idempotency-Key was used before with a different request body."""

    code = "idempotency_key_reused"

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            "this Idempotency-Key was already used with a different request body; "
            "use a new key for a new request"
        )
