"""Error kinds and their retry policy: shared by the adapters, the activities and the workflow."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorKind(StrEnum):
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    PROVIDER_5XX = "provider_5xx"
    PROVIDER_4XX = "provider_4xx"
    PARSE = "parse"
    AUTH = "auth"
    WORKER_CRASH = "worker_crash"
    STUCK = "stuck"
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
        ErrorKind.UNKNOWN,
    }
)

NON_RETRYABLE_TYPES = [kind.value for kind in ErrorKind if not kind.is_retryable]


class AdapterError(Exception):
    """A provider call failed; `kind` says how, `retry_after_s` is the provider's own hint."""

    def __init__(self, kind: ErrorKind, message: str, *, retry_after_s: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class BackoffPolicy:
    """When the next attempt runs. Defaults are shared/DESIGN.md's: 5 s, 25 s, 125 s ± 20 %."""

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
        if kind is ErrorKind.WORKER_CRASH:
            return self.minimum_s
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
