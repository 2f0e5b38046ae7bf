"""The arithmetic of provider budgets (projections/domain/budgets.py), with the window as a
parameter: what fits, who goes first, and when room is expected."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from projections.domain.budgets import (
    Limits,
    budget_room_at,
    fits,
    held_for,
    quota_room_at,
    rank,
)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
MINUTE = timedelta(seconds=60)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_a_draw_counts_a_window_and_a_margin() -> None:
    assert held_for(MINUTE) == timedelta(seconds=61)
    assert held_for(timedelta(seconds=4)) == timedelta(seconds=4.5)


def test_a_call_fits_while_the_window_and_the_waiters_ahead_leave_room() -> None:
    three = Limits(rpm=3, tpm=None)
    assert fits(three, requests=2, tokens=0, ahead_n=0, ahead_tokens=0, draw_tokens=10)
    assert not fits(three, requests=2, tokens=0, ahead_n=1, ahead_tokens=0, draw_tokens=10)
    tokens = Limits(rpm=None, tpm=100)
    assert fits(tokens, requests=50, tokens=60, ahead_n=0, ahead_tokens=0, draw_tokens=40)
    assert not fits(tokens, requests=0, tokens=60, ahead_n=1, ahead_tokens=10, draw_tokens=40)
    assert fits(Limits(None, None), 10**6, 10**9, 10**6, 10**9, 10**9)


def test_rank_orders_by_wait_priority_and_the_orgs_recent_use() -> None:
    limits = Limits(rpm=60, tpm=None)  # a call's share of the minute: 1 s
    fresh = rank(NOW, 50, 5.0, limits, 10, org_calls=0, window=MINUTE)
    urgent = rank(NOW, 10, 5.0, limits, 10, org_calls=0, window=MINUTE)
    busy_org = rank(NOW, 50, 5.0, limits, 10, org_calls=30, window=MINUTE)
    assert urgent < fresh < busy_org
    assert busy_org - fresh == 30.0
    # A priority-90 job that has waited 80 aging periods goes before fresh priority-10 work.
    old = rank(NOW - timedelta(seconds=80 * 5.0 + 1), 90, 5.0, limits, 10, 0, MINUTE)
    assert old < urgent


def test_room_is_expected_when_enough_draws_stop_counting() -> None:
    draws = [(ago(50), 10), (ago(40), 10), (ago(30), 10)]
    # rpm 3, all three spent: room once the oldest stops counting.
    assert budget_room_at(draws, Limits(3, None), 3, 30, 5, NOW, MINUTE) == ago(50) + held_for(
        MINUTE
    )
    # tpm 35, 30 spent, a call of 20 needs 15 to go: the two oldest.
    assert budget_room_at(draws, Limits(None, 35), 3, 30, 20, NOW, MINUTE) == ago(40) + held_for(
        MINUTE
    )
    # More than the window holds: a whole window from now.
    assert budget_room_at([], Limits(1, None), 5, 0, 1, NOW, MINUTE) == NOW + held_for(MINUTE)


def test_an_orgs_quota_fits_now_or_says_when() -> None:
    draws = [(ago(50), 60), (ago(10), 30)]
    assert quota_room_at(draws, 100, 10, NOW, MINUTE) is None
    assert quota_room_at(draws, 100, 20, NOW, MINUTE) == ago(50) + held_for(MINUTE)
    assert quota_room_at(draws, 100, 80, NOW, MINUTE) == ago(10) + held_for(MINUTE)
