"""The shared retry policy: which kinds retry and how long each waits."""

from __future__ import annotations

import pytest

from projections.domain.lifecycle import BackoffPolicy, ErrorKind

POLICY = BackoffPolicy()


@pytest.mark.parametrize(
    ("kind", "retryable"),
    [
        (ErrorKind.TIMEOUT, True),
        (ErrorKind.RATE_LIMIT, True),
        (ErrorKind.PROVIDER_5XX, True),
        (ErrorKind.PROVIDER_4XX, False),
        (ErrorKind.PARSE, False),
        (ErrorKind.AUTH, False),
        (ErrorKind.WORKER_CRASH, True),
        (ErrorKind.STUCK, False),
        (ErrorKind.UNKNOWN, True),
    ],
)
def test_retryable_kinds_follow_the_design(kind: ErrorKind, retryable: bool) -> None:
    assert kind.is_retryable is retryable


@pytest.mark.parametrize(("attempt", "base"), [(1, 5.0), (2, 25.0), (3, 125.0)])
def test_exponential_backoff_is_5_25_125_seconds_with_jitter(attempt: int, base: float) -> None:
    low = POLICY.delay_s(ErrorKind.TIMEOUT, attempt, retry_after_s=None, unit_random=0.0)
    mid = POLICY.delay_s(ErrorKind.TIMEOUT, attempt, retry_after_s=None, unit_random=0.5)
    high = POLICY.delay_s(ErrorKind.TIMEOUT, attempt, retry_after_s=None, unit_random=0.999)
    assert mid == pytest.approx(base)
    assert low == pytest.approx(base * 0.8)
    assert high == pytest.approx(base * 1.2, rel=0.01)


def test_backoff_is_capped() -> None:
    assert POLICY.delay_s(ErrorKind.UNKNOWN, 10, retry_after_s=None, unit_random=0.5) == 600


def test_rate_limit_uses_retry_after_exactly() -> None:
    delay = POLICY.delay_s(ErrorKind.RATE_LIMIT, 1, retry_after_s=7.5, unit_random=0.9)
    assert delay == 7.5


def test_rate_limit_without_hint_waits_at_least_a_minute() -> None:
    for unit in (0.0, 0.5, 0.999):
        assert POLICY.delay_s(ErrorKind.RATE_LIMIT, 1, retry_after_s=None, unit_random=unit) >= 60


def test_lost_worker_is_retried_at_once() -> None:
    assert POLICY.delay_s(ErrorKind.WORKER_CRASH, 1, retry_after_s=None, unit_random=0.5) == 1.0


def test_retry_after_below_the_server_floor_is_one_second() -> None:
    assert POLICY.delay_s(ErrorKind.RATE_LIMIT, 1, retry_after_s=0.2, unit_random=0.5) == 1.0
