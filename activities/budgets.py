"""This worker's side of the provider budgets (projections/budgets.py): which budgets exist,
what an attempt reserves before its call, and what the call taught or cost afterwards.

Which budgets exist is read at most every `refresh_s`, so a worker with none pays nothing per
attempt; a budget this worker learns or pauses itself is known at once. The reservation is an
estimate: the prompt's tokens (about four characters each) plus the job's `max_tokens`, else
the adapter's default, else the typical answer this worker has seen on the budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from activities.adapters.base import AdapterRegistry, InvalidOptions, ProviderLimits
from activities.adapters.conversation import IMAGE_TOKENS, count_images
from activities.adapters.options import PromptOptions, options_of
from activities.prices import PriceTable
from activities.stale import AtMostEvery
from projections.budgets import Budgets, Draw, budget_name
from projections.errors import database_unavailable
from projections.models import Job, Prompt
from projections.spend import NO_CAPS, Caps, SpendCaps

# About four characters a token (OpenAI's rule of thumb for English).
CHARS_PER_TOKEN = 4
# The answer length reserved on a budget before this worker has seen any answer on it.
FIRST_ANSWER_TOKENS = 256


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def input_estimate(text: str, options: PromptOptions, images: int = 0) -> int:
    """A request's input tokens before the provider counts them: its text (a conversation's
    transcript) with its system text and tool definitions, and each image as IMAGE_TOKENS."""
    tools = (
        json.dumps([tool.model_dump(exclude_none=True) for tool in options.tools])
        if options.tools
        else ""
    )
    return estimate_tokens((options.system or "") + text + tools) + images * IMAGE_TOKENS


def answer_limit(adapters: AdapterRegistry, options: PromptOptions) -> int | None:
    """The most tokens the answer may have: the job's `max_tokens`, else its adapter's
    default (None: the provider decides)."""
    if options.max_tokens:
        return options.max_tokens
    try:
        default = getattr(adapters.get(options), "max_tokens", None)
    except InvalidOptions:
        return None  # no such provider here: its call fails, drawing nothing
    return default if isinstance(default, int) else None


def least_tokens(
    adapters: AdapterRegistry, text: str, options: PromptOptions, images: int = 0
) -> int:
    """What a call surely counts against a token limit: its input (`input_estimate`), and
    its answer limit where it has one (providers count `max_tokens` when the request
    arrives)."""
    return input_estimate(text, options, images) + (answer_limit(adapters, options) or 0)


def answer_estimate(
    adapters: AdapterRegistry, options: PromptOptions, typical: float | None = None
) -> int:
    """The answer tokens a call reserves: its answer limit, else the `typical` answer seen on
    its budget, else FIRST_ANSWER_TOKENS."""
    limit = answer_limit(adapters, options)
    if limit is not None:
        return limit
    return round(typical) if typical is not None else FIRST_ANSWER_TOKENS


def call_cost(
    prices: PriceTable,
    adapters: AdapterRegistry,
    text: str,
    options: PromptOptions,
    images: int,
    answer_tokens: int,
    *,
    batch: bool = False,
) -> float | None:
    """What a call may cost: its input estimate and `answer_tokens`, at its model's price (in
    a provider batch, its batch price); None: the model has no price."""
    model = adapters.model_of(options)
    return prices.cost(model, input_estimate(text, options, images), answer_tokens, batch=batch)


@dataclass
class WorkerBudgets:
    store: Budgets
    adapters: AdapterRegistry
    # Each priority point is worth this many seconds of waiting (PROMPTJOBS_PRIORITY_AGING_S).
    aging_s: float = 5.0
    # The budgets the fleet keeps at most (PROMPTJOBS_MAX_PROVIDER_BUDGETS): past it, a call
    # on a model with none runs without one rather than probe (and make one).
    most: int = 1000
    refresh_s: float = 2.0
    # The spend caps (projections/spend.py), and what a call under one may cost: priced by
    # `prices`; a model without a price is held as free only if `allow_unpriced`.
    spend: SpendCaps | None = None
    prices: PriceTable | None = None
    allow_unpriced: bool = False
    _caps: Caps = NO_CAPS
    # Every budget the store has, and whether it may refuse a call (a limit, pause, probe).
    _known: dict[str, bool] = field(default_factory=dict)
    # Orgs with a quota of their own: tokens a minute over every budget.
    _quotas: dict[str, int] = field(default_factory=dict)
    _learned: dict[str, ProviderLimits | None] = field(default_factory=dict)
    _typical: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._every = AtMostEvery(self.refresh_s, self._read)

    async def refresh(self) -> None:
        """Read the budgets and quotas again if the last read is stale (once, however many
        attempts ask meanwhile)."""
        await self._every()

    async def _read(self) -> None:
        # While the database is unreachable the last read stands: the attempt's start waits
        # the outage out anyway.
        try:
            self._known = await self.store.known()
            self._quotas = await self.store.org_quotas()
            if self.spend is not None:
                self._caps = await self.spend.caps()
        except Exception as err:
            if not database_unavailable(err):
                raise

    def may_bind(self) -> bool:
        """Whether any attempt of this worker may have to draw: a budget binds, or a
        configured provider says its limits (its first call on a model probes them)."""
        return (
            any(self._known.values())
            or bool(self._quotas)
            or bool(self._caps)
            or self.adapters.learning_limits()
        )

    def name_of(self, job: Job, prompt: Prompt) -> str:
        options, _ = options_of(job, prompt)
        return budget_name(self.adapters.provider_of(options), self.adapters.model_of(options))

    def draw_of(self, job: Job, prompt: Prompt) -> Draw | None:
        """What the attempt reserves, if its provider and model may have a budget: one that
        binds, or none yet on a provider that says its limits (the call then probes them)."""
        options, _ = options_of(job, prompt)
        name = self.name_of(job, prompt)
        binds = self._known.get(name)
        learns = self.adapters.learns_limits(options) and (
            binds is not None or len(self._known) < self.most
        )
        quota = self._quotas.get(job.org)
        caps = self._caps.of(job.org, job.key_id)
        if quota is None and not caps and (binds is False or (binds is None and not learns)):
            return None
        if binds is None and learns:
            # Counted at once toward `most`: the next read confirms it (or drops it).
            self._known[name] = True
        tokens = self.estimate(job, prompt, name)
        usd = self.cost_of(job, prompt, name) if caps else 0.0
        return Draw(
            name,
            tokens,
            job.priority,
            self.aging_s,
            probe=learns,
            org=job.org,
            org_tpm=quota,
            caps=caps,
            usd=usd,
            key_id=job.key_id,
        )

    def cost_of(self, job: Job, prompt: Prompt, name: str) -> float | None:
        """What the call its draw estimates may cost, at its model's price (None: the model
        has no price, and unpriced models are not allowed under a cap)."""
        options, _ = options_of(job, prompt)
        answer = answer_estimate(self.adapters, options, self._typical.get(name))
        prices = self.prices or PriceTable.load(None)
        images = count_images(prompt.messages)
        cost = call_cost(prices, self.adapters, prompt.text, options, images, answer)
        if cost is None:
            return 0.0 if self.allow_unpriced else None
        return cost

    def estimate(self, job: Job, prompt: Prompt, name: str) -> int:
        options, _ = options_of(job, prompt)
        asked = input_estimate(prompt.text, options, count_images(prompt.messages))
        return asked + answer_estimate(self.adapters, options, self._typical.get(name))

    async def after_call(
        self,
        name: str,
        job_id: str,
        attempt: int,
        *,
        drew: bool,
        counted: bool,
        probing: bool = False,
        answered: bool = True,
        started_at: datetime,
        tokens: int,
        output_tokens: int,
        limits: ProviderLimits | None,
    ) -> None:
        """Charge the draw what the call cost, and keep what the provider said of its limits
        (written only when it changed: most answers repeat the last). A call the provider
        `counted` that drew nothing (its budget was not known when it started) is counted
        now, so the budget's minute holds what the provider's does. A call the provider did
        not answer for its model (`answered` False: a client error, an unknown model say)
        teaches nothing, and leaves no budget that nothing else set, taught or paused: a
        tenant's junk model names make no rows, whether or not its call was the probe."""
        if not answered:
            await self.store.discard_unanswered(name, probing=probing)
            self._known.pop(name, None)
        changed = (
            answered
            and limits is not None
            and self._learned.get(name) != limits
            # A budget the cap kept from being made is not made by what its call taught.
            and (name in self._known or len(self._known) < self.most)
        )
        if changed or (answered and probing):
            # What the provider says of its limits (nothing: the probe is over all the same,
            # also where this worker learned that before: a junk model's unanswered call
            # forgets the budget, and the next call on it probes again).
            said = limits or ProviderLimits(None, None)
            await self.store.learn(name, said.rpm, said.tpm, datetime.now(UTC))
            self._learned[name] = limits
            self._known[name] = limits is not None
        if drew:
            await self.store.reconcile(job_id, attempt, tokens)
        elif counted and self._known.get(name):
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
        self._known[name] = True
        return until
