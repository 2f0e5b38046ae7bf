"""The service's Prometheus metrics, each counted in the process where the thing happens.

Counters live in process memory: the API process counts submissions and the transitions it
commits (cancels, retries); the worker process counts the transitions its activities commit
and the adapter calls it makes. `promptjobs dev` runs both in one process, so its `/metrics`
shows everything; a separate worker process serves no HTTP (see docs/operators.md).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from projections.lifecycle import JobState
from projections.models import Job

SUBMISSIONS = Counter(
    "promptjobs_submissions", "Prompts accepted: a committed prompt and its first job", ["org"]
)
TRANSITIONS = Counter(
    "promptjobs_job_transitions",
    "Job state changes committed to the projection (one per job event)",
    ["state", "error_kind"],
)
ADAPTER_LATENCY = Histogram(
    "promptjobs_adapter_call_seconds",
    "Duration of one adapter call (one attempt), by provider and outcome (ok or error kind)",
    ["provider", "outcome"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
JOBS = Gauge(
    "promptjobs_jobs",
    "Jobs queued or running now, read from the projection when /metrics is scraped",
    ["state"],
)

_PENDING = "promptjobs.pending_transitions"


def transition_pending(session: AsyncSession, job: Job) -> None:
    """Note a transition in this transaction; it is counted only if the transaction commits."""
    kind = job.error_kind if job.state in (JobState.QUEUED, JobState.FAILED) else None
    session.sync_session.info.setdefault(_PENDING, []).append((job.state.value, kind or ""))


@event.listens_for(Session, "after_commit")
def _count_committed(session: Session) -> None:
    for state, kind in session.info.pop(_PENDING, []):
        TRANSITIONS.labels(state=state, error_kind=kind).inc()


@event.listens_for(Session, "after_rollback")
def _forget_rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)


def record_queue_depth(counts: dict[JobState, int]) -> None:
    for state in (JobState.QUEUED, JobState.RUNNING):
        JOBS.labels(state=state.value).set(counts.get(state, 0))
