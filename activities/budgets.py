"""This worker's side of the provider budgets (projections/budgets.py): which budgets exist,
what an attempt reserves before its call, and what the call taught or cost afterwards.

Which budgets exist is read at most every `refresh_s`, so a worker with none pays nothing per
attempt; a budget this worker learns or pauses itself is known at once. The reservation is an
estimate: the prompt's tokens (about four characters each) plus the job's `max_tokens`, else
the adapter's default, else the typical answer this worker has seen on the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from activities.adapters.base import AdapterRegistry, ProviderLimits
from projections.budgets import Budgets, Draw, budget_name
from projections.models import Job, Prompt, job_options

# About four characters a token (OpenAI's rule of thumb for English).
CHARS_PER_TOKEN = 4
# The answer length reserved on a budget before this worker has seen any answer on it.
FIRST_ANSWER_TOKENS = 256


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass
class WorkerBudgets:
    store: Budgets
    adapters: AdapterRegistry
    # Each priority point is worth this many seconds of waiting (PROMPTJOBS_PRIORITY_AGING_S).
    aging_s: float = 5.0
    refresh_s: float = 2.0
    _names: frozenset[str] = frozenset()
    _read_at: float = -1e9
    _learned: dict[str, ProviderLimits] = field(default_factory=dict)
    _typical: dict[str, float] = field(default_factory=dict)

    async def names(self) -> frozenset[str]:
        if time.monotonic() - self._read_at >= self.refresh_s:
            self._names = await self.store.names()
            self._read_at = time.monotonic()
        return self._names

    def name_of(self, job: Job, prompt: Prompt) -> str:
        options = job_options(job, prompt)
        return budget_name(self.adapters.provider_of(options), self.adapters.model_of(options))

    async def draw_for(self, job: Job, prompt: Prompt) -> Draw | None:
        """What the attempt reserves, if its provider and model have a budget."""
        names = await self.names()
        if not names:
            return None
        name = self.name_of(job, prompt)
        if name not in names:
            return None
        return Draw(name, self.estimate(job, prompt, name), job.priority, self.aging_s)

    def estimate(self, job: Job, prompt: Prompt, name: str) -> int:
        options = job_options(job, prompt)
        system = str(options.get("system") or "")
        answer = options.get("max_tokens")
        if not isinstance(answer, int) or answer <= 0:
            adapter = self.adapters.get(options)
            default = getattr(adapter, "max_tokens", None)
            typical = self._typical.get(name)
            answer = (
                default
                if isinstance(default, int)
                else round(typical)
                if typical is not None
                else FIRST_ANSWER_TOKENS
            )
        return estimate_tokens(system + prompt.text) + answer

    async def after_call(
        self,
        name: str,
        job_id: str,
        attempt: int,
        *,
        drew: bool,
        counted: bool,
        started_at: datetime,
        tokens: int,
        output_tokens: int,
        limits: ProviderLimits | None,
    ) -> None:
        """Charge the draw what the call cost, and keep what the provider said of its limits
        (written only when it changed: most answers repeat the last). A call the provider
        `counted` that drew nothing (its budget was not known when it started) is counted
        now, so the budget's minute holds what the provider's does."""
        if limits is not None and self._learned.get(name) != limits:
            await self.store.learn(name, limits.rpm, limits.tpm, datetime.now(UTC))
            self._learned[name] = limits
            self._names = self._names | {name}
        if drew:
            await self.store.reconcile(job_id, attempt, tokens)
        elif counted and name in self._names:
            await self.store.drawn_after(name, job_id, attempt, started_at, tokens)
        if counted:
            seen = self._typical.get(name)
            typical = output_tokens if seen is None else 0.8 * seen + 0.2 * output_tokens
            self._typical[name] = typical

    async def rate_limited(self, name: str, job_id: str, attempt: int, wait_s: float) -> datetime:
        """The provider answered 429: pause the budget for every worker; until when."""
        now = datetime.now(UTC)
        until = now + timedelta(seconds=wait_s)
        await self.store.rate_limited(name, job_id, attempt, until, now)
        self._names = self._names | {name}
        return until
