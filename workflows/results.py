"""How a job's closed workflow reads to its callers: a Failed workflow of our own is a settled job.

PromptJobWorkflow ends a failed job by failing (since the patch `fail-failed-jobs`), after its
row is settled, with a non-retryable ApplicationError whose type is the error kind. Whoever
reads a workflow's result (the reconciler, tests, tools) must read that as the job's outcome,
and anything else that failed the workflow as what it is: a workflow that lost its job.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from projections.domain.lifecycle import JobState, kind_of_error_type
from workflows.contracts import PromptJobResult


def settled_failure(job_id: str, err: WorkflowFailureError) -> PromptJobResult | None:
    """The failed job `err` reports, if our own code path failed the workflow; else None."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.non_retryable:
        kind = kind_of_error_type(cause.type)
        if kind is not None:
            return PromptJobResult(
                job_id, JobState.FAILED, error_kind=kind, error_message=cause.message
            )
    return None


async def job_result(handle: WorkflowHandle[Any, Any]) -> PromptJobResult:
    """The job's outcome once its workflow has closed: its result, or the failed job a Failed
    workflow of ours reports. Any other failure (a cancel included) raises as it is."""
    try:
        result = await handle.result()
        return result if isinstance(result, PromptJobResult) else PromptJobResult(**result)
    except WorkflowFailureError as err:
        failed = settled_failure(handle.id, err)
        if failed is None:
            raise
        return failed
