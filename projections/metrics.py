"""The service's Prometheus metrics, each counted in the process where the thing happens.

Counters live in process memory: the API process counts submissions and the transitions it
commits (cancels, retries); the worker process counts the transitions its activities commit
and the adapter calls it makes. An API's `/metrics` shows the API's; a worker (`promptjobs
dev`'s too: it runs its worker in a process of its own) serves its own on
PROMPTJOBS_WORKER_METRICS_PORT (docs/operators.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram

from projections.domain.lifecycle import JobState


class UsageRecord(Protocol):
    """What `count_usage` reads of an attempt's usage record (projections/streams.py's)."""

    @property
    def provider(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def input_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...
    @property
    def cost_usd(self) -> float | None: ...


SUBMISSIONS = Counter(
    "promptjobs_submissions",
    "Prompts accepted: a committed prompt and its first job; org is empty unless "
    "PROMPTJOBS_METRICS_ORG_LABELS is on",
    ["org"],
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
SCHEMA_CHECKS = Counter(
    "promptjobs_schema_checks",
    "Answers checked against their job's output schema, by provider, model and outcome "
    "(match, or miss: a schema_mismatch attempt)",
    ["provider", "model", "outcome"],
)
JOBS = Gauge(
    "promptjobs_jobs",
    "Jobs queued or running now, read from the projection when /metrics is scraped "
    "(at most once per PROMPTJOBS_METRICS_CACHE_S)",
    ["state"],
)

TOKENS = Counter(
    "promptjobs_tokens",
    "Tokens attempts consumed (the provider's counts, or estimates where it gave none), by "
    "provider, model and direction (input or output); org is empty unless "
    "PROMPTJOBS_METRICS_ORG_LABELS is on",
    ["provider", "model", "direction", "org"],
)
COST = Counter(
    "promptjobs_cost_usd",
    "What attempts cost by the workers' price table, in US dollars (attempts on a model "
    "without a price are counted in promptjobs_unpriced_attempts instead)",
    ["provider", "model", "org"],
)
UNPRICED = Counter(
    "promptjobs_unpriced_attempts",
    "Attempts whose cost is unknown: their model has no price in PROMPTJOBS_PRICES_FILE",
    ["provider", "model", "org"],
)

BUDGET_LIMIT = Gauge(
    "promptjobs_budget_limit",
    "A provider budget's limit a minute (the operator's, else the provider's), by unit "
    "(requests or tokens); absent: no limit",
    ["budget", "unit"],
)
BUDGET_USED = Gauge(
    "promptjobs_budget_used",
    "What a provider budget's last minute spent, by unit (requests; tokens the provider "
    "reported, plus those reserved by calls in flight)",
    ["budget", "unit"],
)
BUDGET_RESERVED = Gauge(
    "promptjobs_budget_reserved_tokens",
    "Tokens reserved by a provider budget's calls in flight (estimates not yet reconciled)",
    ["budget"],
)
BUDGET_WAITING = Gauge(
    "promptjobs_budget_waiting_jobs",
    "Jobs queued waiting for room in a provider budget",
    ["budget"],
)
BUDGET_PAUSED = Gauge(
    "promptjobs_budget_paused",
    "1 while a provider budget is paused by the provider's 429 (its Retry-After), else 0 "
    '(budget="other": how many of the budgets past the label cap are paused)',
    ["budget"],
)
BUDGET_RATE_LIMITED = Gauge(
    "promptjobs_budget_rate_limited",
    "429s a provider answered on a budget, all told (as stored: every worker's)",
    ["budget"],
)

CIRCUIT_OPEN = Gauge(
    "promptjobs_circuit_open",
    "1 while a place's circuit is open (jobs that can run elsewhere skip it), else 0, for "
    "each place that failed lately; its outage failures in a row are `_failures`",
    ["place"],
)
CIRCUIT_FAILURES = Gauge(
    "promptjobs_circuit_failures",
    "Outage failures in a row at a place, fleet-wide (a success there resets it)",
    ["place"],
)
CIRCUIT_OPENED = Counter(
    "promptjobs_circuit_opened_total",
    "Times this worker's call opened a place's circuit (or opened it again past a cool-down)",
    ["place"],
)

SPEND_CAP = Gauge(
    "promptjobs_spend_cap_usd",
    "A spend cap's US dollars a day (cap: org:NAME or key:ID; orgs limit --usd-per-day)",
    ["cap"],
)
SPEND_USED = Gauge(
    "promptjobs_spend_cap_used_usd",
    "What a cap's UTC day has spent (attempts ended) and holds (calls in flight), US dollars",
    ["cap"],
)
SPEND_WAITING = Gauge(
    "promptjobs_spend_cap_waiting_jobs",
    "Jobs queued waiting for room under a spend cap",
    ["cap"],
)
SPEND_CROSSED = Counter(
    "promptjobs_spend_cap_crossed_total",
    "Times a cap's day passed a share of it (0.8, 1), as the API process that noticed saw it",
    ["cap", "share"],
)

WEBHOOKS = Counter(
    "promptjobs_webhook_tries_total",
    "Webhook delivery tries, by outcome: delivered (2xx), retried (to be tried again), failed "
    "(tries over, 410 Gone), refused (an address inside a network)",
    ["outcome"],
)
WEBHOOK_LATENCY = Histogram(
    "promptjobs_webhook_delivery_seconds",
    "From the state change a delivery tells of to the receiver's 2xx",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 21600, 86400),
)

# Every budget's gauges: set anew on each scrape (record_budgets).
BUDGET_GAUGES = (
    BUDGET_LIMIT,
    BUDGET_USED,
    BUDGET_RESERVED,
    BUDGET_WAITING,
    BUDGET_PAUSED,
    BUDGET_RATE_LIMITED,
)

ALL = (
    SUBMISSIONS,
    TRANSITIONS,
    ADAPTER_LATENCY,
    JOBS,
    TOKENS,
    COST,
    UNPRICED,
    *BUDGET_GAUGES,
    CIRCUIT_OPEN,
    CIRCUIT_FAILURES,
    CIRCUIT_OPENED,
)


def transition_labels(state: JobState, error_kind: str | None) -> tuple[str, str]:
    """The labels of one committed transition (an error kind only where the state has one)."""
    kind = error_kind if state.shows_error else None
    return state.value, kind or ""


class BoundedLabels:
    """Label values a tenant could mint without end (a job's options name its model, and its
    budget): the first `most` a process sees are kept, the rest count under "other", so a
    scrape stays bounded."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self.most:
            self._seen.add(value)
            return value
        return "other"


MAX_MODEL_LABELS = 200
MODEL_LABELS = BoundedLabels(MAX_MODEL_LABELS)


def model_label(model: str) -> str:
    return MODEL_LABELS(model)


def count_usage(usage: UsageRecord, org: str) -> None:
    """Count one recorded attempt's tokens and cost."""
    labels = {"provider": usage.provider, "model": model_label(usage.model), "org": org}
    TOKENS.labels(direction="input", **labels).inc(usage.input_tokens or 0)
    TOKENS.labels(direction="output", **labels).inc(usage.output_tokens or 0)
    if usage.cost_usd is None:
        UNPRICED.labels(**labels).inc()
    else:
        COST.labels(**labels).inc(usage.cost_usd)


class BudgetFigures(Protocol):
    """What /metrics shows of one provider budget (projections/budgets.BudgetStanding)."""

    @property
    def name(self) -> str: ...
    @property
    def rpm(self) -> int | None: ...
    @property
    def tpm(self) -> int | None: ...
    @property
    def requests(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def reserved(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def paused_until(self) -> object | None: ...
    @property
    def rate_limited(self) -> int: ...


# Budgets are named by tenants' model names too: past this many a process sums the rest under
# "other" (a set of their own: a budget's name never takes a model's place, or the reverse).
MAX_BUDGET_LABELS = 200
BUDGET_LABELS = BoundedLabels(MAX_BUDGET_LABELS)


@dataclass
class _BudgetSums:
    """One label's figures: one budget's, or the sum of those under "other"."""

    requests_limit: int | None = None
    tokens_limit: int | None = None
    requests: int = 0
    tokens: int = 0
    reserved: int = 0
    waiting: int = 0
    paused: int = 0
    rate_limited: int = 0

    def add(self, b: BudgetFigures) -> None:
        if b.rpm is not None:
            self.requests_limit = (self.requests_limit or 0) + b.rpm
        if b.tpm is not None:
            self.tokens_limit = (self.tokens_limit or 0) + b.tpm
        self.requests += b.requests
        self.tokens += b.tokens + b.reserved
        self.reserved += b.reserved
        self.waiting += b.waiting
        self.paused += b.paused_until is not None
        self.rate_limited += b.rate_limited


def record_budgets(budgets: Iterable[BudgetFigures]) -> None:
    """Each budget's figures, set anew (a budget forgotten since leaves no series). Past
    MAX_BUDGET_LABELS budgets the rest are summed under `budget="other"`: its paused gauge
    counts how many of them are paused."""
    for gauge in BUDGET_GAUGES:
        gauge.clear()
    sums: dict[str, _BudgetSums] = {}
    for b in budgets:
        sums.setdefault(BUDGET_LABELS(b.name), _BudgetSums()).add(b)
    for name, f in sums.items():
        for unit, limit in (("requests", f.requests_limit), ("tokens", f.tokens_limit)):
            if limit is not None:
                BUDGET_LIMIT.labels(budget=name, unit=unit).set(limit)
        BUDGET_USED.labels(budget=name, unit="requests").set(f.requests)
        BUDGET_USED.labels(budget=name, unit="tokens").set(f.tokens)
        BUDGET_RESERVED.labels(budget=name).set(f.reserved)
        BUDGET_WAITING.labels(budget=name).set(f.waiting)
        BUDGET_PAUSED.labels(budget=name).set(f.paused)
        BUDGET_RATE_LIMITED.labels(budget=name).set(f.rate_limited)


class CircuitFigures(Protocol):
    @property
    def place(self) -> str: ...

    @property
    def failures(self) -> int: ...

    def is_open(self, now: datetime) -> bool: ...


def record_circuits(circuits: Iterable[CircuitFigures], now: datetime) -> None:
    """Each place that failed lately, set anew (one that recovered leaves no series)."""
    for gauge in (CIRCUIT_OPEN, CIRCUIT_FAILURES):
        gauge.clear()
    for c in list(circuits)[:MAX_BUDGET_LABELS]:
        CIRCUIT_OPEN.labels(place=c.place).set(1 if c.is_open(now) else 0)
        CIRCUIT_FAILURES.labels(place=c.place).set(c.failures)


class CapFigures(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def usd_per_day(self) -> float: ...

    @property
    def used(self) -> float: ...

    @property
    def waiting(self) -> int: ...


def record_caps(caps: Iterable[CapFigures]) -> None:
    """Each cap in force, set anew (a cap removed leaves no series)."""
    for gauge in (SPEND_CAP, SPEND_USED, SPEND_WAITING):
        gauge.clear()
    for c in list(caps)[:MAX_BUDGET_LABELS]:
        SPEND_CAP.labels(cap=c.name).set(c.usd_per_day)
        SPEND_USED.labels(cap=c.name).set(c.used)
        SPEND_WAITING.labels(cap=c.name).set(c.waiting)


def record_queue_depth(counts: dict[JobState, int]) -> None:
    for state in (JobState.QUEUED, JobState.RUNNING):
        JOBS.labels(state=state.value).set(counts.get(state, 0))


class QueueDepth:
    """Jobs per state, read from the projection at most once per `max_age_s`.

    A scrape would otherwise count the whole jobs table each time; Prometheus (or several)
    scraping every few seconds, or anyone hammering an open /metrics, then costs one query
    per interval. Concurrent scrapes share the one read in flight."""

    def __init__(
        self,
        read: Callable[[], Awaitable[dict[JobState, int]]],
        max_age_s: float,
        budgets: Callable[[], Awaitable[Iterable[BudgetFigures]]] | None = None,
        circuits: Callable[[], Awaitable[Iterable[CircuitFigures]]] | None = None,
        caps: Callable[[], Awaitable[Iterable[CapFigures]]] | None = None,
    ) -> None:
        self._read = read
        self._budgets = budgets
        self._circuits = circuits
        self._caps = caps
        self._max_age_s = max_age_s
        self._read_at: float | None = None
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:
            now = time.monotonic()
            if self._read_at is not None and now - self._read_at < self._max_age_s:
                return
            record_queue_depth(await self._read())
            if self._budgets is not None:
                record_budgets(await self._budgets())
            if self._circuits is not None:
                record_circuits(await self._circuits(), datetime.now(UTC))
            if self._caps is not None:
                record_caps(await self._caps())
            self._read_at = time.monotonic()
