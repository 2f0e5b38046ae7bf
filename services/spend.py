"""The API's side of the spend caps (projections/spend.py): what a submission meets at the
door. A job under a cap on a model without a price is refused (unless the operator allows
such calls, counted as free); a submission past a cap is refused where its org chose so
(otherwise it is accepted and waits, queued, for the cap's room); a job whose call alone may
cost more than a cap is refused, since it could never run under it.

The caps are read at most every CAPS_READ_S, and what a cap has spent at most every
SPENT_READ_S, however many requests ask meanwhile: a raised cap lets submissions in within
that, and a burst past a cap may be accepted for that long before refusals begin (the jobs
accepted then wait for room like any other)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from activities.adapters.base import AdapterRegistry
from activities.adapters.options import PromptOptions
from activities.budgets import answer_limit, call_cost
from activities.prices import PriceTable
from activities.stale import AtMostEvery
from projections import metrics
from projections.scope import Scope
from projections.shared_reads import SharedReads
from projections.spend import (
    NO_CAPS,
    THRESHOLDS,
    Cap,
    Caps,
    CostsMoreThanCap,
    OverSpendCap,
    SpendCaps,
    UnpricedUnderCap,
    day_of,
    resets_at,
)

log = logging.getLogger("promptjobs.spend")

CAPS_READ_S = 2.0
SPENT_READ_S = 1.0


@dataclass
class SpendGate:
    store: SpendCaps
    adapters: AdapterRegistry
    prices: PriceTable
    allow_unpriced: bool = False
    _caps: Caps = NO_CAPS
    _spent: dict[str, tuple[float, float]] = field(default_factory=dict)
    _reads: SharedReads[str, float] = field(default_factory=SharedReads)

    def __post_init__(self) -> None:
        self._read_caps = AtMostEvery(CAPS_READ_S, self._caps_now)

    async def _caps_now(self) -> None:
        self._caps = await self.store.caps()

    async def check(self, scope: Scope, text: str, options: PromptOptions, images: int) -> None:
        """Raise UnpricedUnderCap or OverSpendCap if the submission may not be accepted."""
        await self._read_caps()
        caps = self._caps.of(scope.org, scope.key_id)
        if not caps:
            return
        model = self.adapters.model_of(options)
        price = self.prices.price_of(model)
        if price is None:
            if self.allow_unpriced:
                return
            raise UnpricedUnderCap(caps[0], model)
        now = datetime.now(UTC)
        # The least it may cost: its answer limit, if it has one, counted whole.
        answer = answer_limit(self.adapters, options) or 0
        usd = call_cost(self.prices, self.adapters, text, options, images, answer) or 0.0
        for cap in caps:
            if usd > cap.usd_per_day:
                raise CostsMoreThanCap(cap, usd)
        if scope.org not in self._caps.refusing:
            return
        for cap in caps:
            spent = await self._spent_of(cap)
            if spent >= cap.usd_per_day:
                raise OverSpendCap(cap, spent, resets_at(now))

    async def _spent_of(self, cap: Cap) -> float:
        seen = self._spent.get(cap.name)
        if seen is not None and time.monotonic() - seen[0] < SPENT_READ_S:
            return seen[1]

        async def read() -> float:
            spent = await self.store.spent(cap, datetime.now(UTC))
            self._spent[cap.name] = (time.monotonic(), spent)
            return spent

        return await self._reads.read(cap.name, read)


# How often the dispatcher looks at the caps' shares for the 80 % and 100 % notices.
WATCH_S = 10.0


@dataclass
class SpendWatch:
    """Says, once per cap and day, when a cap's day passes 80 % and 100 % of it: a warning in
    the log and `promptjobs_spend_cap_crossed_total` (the gauges are /metrics' own, read at
    each scrape). Each API process's dispatcher watches: with several, each says so."""

    store: SpendCaps
    every_s: float = WATCH_S
    _said: dict[str, tuple[datetime, float]] = field(default_factory=dict)
    _last: float = -1e9

    async def watch_once(self) -> int:
        """The notices given now (none until `every_s` has passed since the last look)."""
        if time.monotonic() - self._last < self.every_s:
            return 0
        self._last = time.monotonic()
        now = datetime.now(UTC)
        today = day_of(now)
        notices = 0
        for standing in await self.store.standings(now):
            cap = standing.cap
            passed = max((t for t in THRESHOLDS if standing.share >= t), default=0.0)
            day, said = self._said.get(cap.name, (today, 0.0))
            if day != today:
                said = 0.0
            if passed > said:
                log.warning(
                    "%s spend cap: %.0f%% of its $%.2f a day used ($%.4f spent, $%.4f held by "
                    "calls in flight)%s",
                    cap.describe(),
                    100 * standing.share,
                    cap.usd_per_day,
                    standing.spent,
                    standing.held,
                    "; its jobs wait for the day to turn" if passed >= 1.0 else "",
                )
                metrics.SPEND_CROSSED.labels(cap=cap.name, share=f"{passed:g}").inc()
                notices += 1
            self._said[cap.name] = (today, max(said, passed))
        return notices
