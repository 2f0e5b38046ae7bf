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

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from activities.adapters.base import AdapterRegistry
from activities.adapters.options import PromptOptions
from activities.budgets import input_estimate, least_tokens
from activities.prices import PriceTable
from activities.stale import AtMostEvery
from projections.scope import Scope
from projections.shared_reads import SharedReads
from projections.spend import (
    NO_CAPS,
    Cap,
    Caps,
    CostsMoreThanCap,
    OverSpendCap,
    SpendCaps,
    UnpricedUnderCap,
    resets_at,
)

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
        least = least_tokens(self.adapters, text, options, images)
        prompt = input_estimate(text, options, images)
        usd = self.prices.cost(model, prompt, least - prompt) or 0.0
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
