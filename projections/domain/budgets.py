"""The arithmetic of provider budgets (projections/budgets.py holds the SQL beside it): how long
a draw counts, whether a call fits the window, a waiter's rank, and when room is expected.
Pure: every function takes the window and the draws it reasons about; nothing is read here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class Limits:
    """A budget's limits in force: the operator's, else the learned ones (None: no limit)."""

    rpm: int | None
    tpm: int | None

    @classmethod
    def of(cls, row: Any) -> Limits:
        return cls(row.rpm or row.learned_rpm, row.tpm or row.learned_tpm)

    @property
    def binding(self) -> bool:
        return self.rpm is not None or self.tpm is not None


# A draw: when it was taken, and its tokens.
Drawn = tuple[datetime, int]


def held_for(window: timedelta) -> timedelta:
    """How long a draw counts: the window, and a margin (1 s a minute, at least 0.5 s). A draw
    is taken before its request reaches the provider, and the request that replaces it may get
    there sooner than it did: without the margin, that one could land inside the provider's
    minute of the first."""
    return window + max(window / 60, timedelta(seconds=0.5))


def fits(
    limits: Limits, requests: int, tokens: int, ahead_n: int, ahead_tokens: int, draw_tokens: int
) -> bool:
    """Whether a call of `draw_tokens` fits: the window's draws (`requests`, `tokens`) and what
    the waiters ranked before it need (`ahead_n`, `ahead_tokens`) leave it room."""
    requests_fit = limits.rpm is None or requests + ahead_n < limits.rpm
    tokens_fit = limits.tpm is None or tokens + ahead_tokens + draw_tokens <= limits.tpm
    return requests_fit and tokens_fit


def rank(
    now: datetime,
    priority: int,
    aging_s: float,
    limits: Limits,
    draw_tokens: int,
    org_calls: int,
    window: timedelta,
) -> float:
    """A new waiter's rank (lower goes first): when it began to wait, plus priority x aging,
    plus its org's recent use: one call's share of the window for each of the `org_calls` its
    org drew on the budget in the last window. Within an org that is the same for every job,
    so priority and age decide; between orgs, an org that just had the budget to itself waits
    behind another org's job that came a little later (fair queuing by recent use)."""
    if limits.rpm is not None:
        spacing = window.total_seconds() / limits.rpm
    elif limits.tpm is not None:
        spacing = window.total_seconds() * draw_tokens / limits.tpm
    else:
        spacing = 0.0
    return now.timestamp() + priority * aging_s + spacing * org_calls


def room_at(
    draws: Sequence[Drawn],
    *,
    leave_requests: int,
    leave_tokens: int,
    now: datetime,
    window: timedelta,
) -> datetime:
    """When enough of the window's `draws` (oldest first) will have stopped counting that
    `leave_requests` requests and `leave_tokens` tokens are gone; a held window away at most
    (then the whole window is free)."""
    held = held_for(window)
    left_requests = left_tokens = 0
    for drawn_at, tokens in draws:
        left_requests += 1
        left_tokens += tokens
        if left_requests >= leave_requests and left_tokens >= leave_tokens:
            return drawn_at + held
    return now + held


def budget_room_at(
    draws: Sequence[Drawn],
    limits: Limits,
    requests: int,
    tokens: int,
    draw_tokens: int,
    now: datetime,
    window: timedelta,
) -> datetime:
    """When a call of `draw_tokens` will fit a budget whose window holds `requests` and
    `tokens` (those of the waiters before it counted in)."""
    return room_at(
        draws,
        leave_requests=0 if limits.rpm is None else requests - limits.rpm + 1,
        leave_tokens=0 if limits.tpm is None else tokens + draw_tokens - limits.tpm,
        now=now,
        window=window,
    )


def quota_room_at(
    draws: Sequence[Drawn], quota: int, draw_tokens: int, now: datetime, window: timedelta
) -> datetime | None:
    """When a call of `draw_tokens` fits an org's quota of tokens a window, given the org's
    `draws` of the window (oldest first); None: it fits now."""
    used = sum(tokens for _, tokens in draws)
    if used + draw_tokens <= quota:
        return None
    return room_at(
        draws, leave_requests=0, leave_tokens=used + draw_tokens - quota, now=now, window=window
    )
