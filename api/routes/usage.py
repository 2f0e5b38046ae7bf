"""GET /v1/usage: what the caller's jobs have spent today and this month (an admin: the org's)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TypeVar

from fastapi import APIRouter

from api.deps import Caller, ContextDep
from api.problems import problem_responses
from api.schemas import CapOut, SpendOut, SpendPeriod, UsageOut
from projections.reads import SpendLine
from projections.spend import resets_at

router = APIRouter(prefix="/v1/usage", tags=["usage"])


@router.get("", response_model=UsageOut, responses=problem_responses(401))
async def read_usage(caller: Caller, ctx: ContextDep) -> UsageOut:
    """Tokens and dollars the attempts of your jobs consumed since the start of today and of
    this month (UTC), by provider and model and by API key; an admin key reads the whole
    org's, by user too. `caps`: the spend caps your jobs count against, and what today used.
    Costs are the price table's (`PROMPTJOBS_PRICES_FILE`): an attempt on a model it does not
    price is counted in `unpriced_attempts`, not in `cost_usd`."""
    now = datetime.now(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    by_user = caller.author is None
    lines = await ctx.store.spend(caller, month, recent=day)
    caps = []
    for cap in (await ctx.store.spend_caps.caps()).of(caller.org, caller.key_id):
        spent, held = await ctx.store.spend_caps.spent_and_held(cap, now)
        caps.append(
            CapOut(
                key_id=cap.key_id,
                usd_per_day=cap.usd_per_day,
                spent_usd=round(spent, 9),
                held_usd=round(held, 9),
                resets_at=resets_at(now),
            )
        )
    return UsageOut(
        org=caller.org,
        user=None if by_user else caller.user,
        today=_period(day, [line for line in lines if line.recent], by_user),
        month=_period(month, lines, by_user),
        caps=caps,
    )


def _period(since: datetime, lines: list[SpendLine], by_user: bool) -> SpendPeriod:
    return SpendPeriod(
        since=since,
        **_sum(lines).model_dump(),
        by_model=[
            _sum(group).model_copy(update={"provider": provider, "model": model})
            for (provider, model), group in _grouped(lines, lambda x: (x.provider, x.model))
        ],
        by_user=[
            _sum(group).model_copy(update={"user": user})
            for user, group in _grouped(lines, lambda x: x.user)
        ]
        if by_user
        else None,
        by_key=[
            _sum(group).model_copy(update={"key_id": key_id or None})
            for key_id, group in _grouped(lines, lambda x: x.key_id or "")
        ],
    )


K = TypeVar("K", str, tuple[str, str])


def _grouped(
    lines: Iterable[SpendLine], key: Callable[[SpendLine], K]
) -> list[tuple[K, list[SpendLine]]]:
    groups: dict[K, list[SpendLine]] = {}
    for line in lines:
        groups.setdefault(key(line), []).append(line)
    return sorted(groups.items())


def _sum(lines: Iterable[SpendLine]) -> SpendOut:
    lines = list(lines)
    return SpendOut(
        attempts=sum(line.attempts for line in lines),
        input_tokens=sum(line.input_tokens for line in lines),
        output_tokens=sum(line.output_tokens for line in lines),
        cost_usd=round(sum(line.cost_usd for line in lines), 9),
        unpriced_attempts=sum(line.unpriced for line in lines),
    )
