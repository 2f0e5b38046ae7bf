"""A deferrable job's own activity (issue 33): `defer_job`, from the job's workflow. The job
waits to be gathered into a provider batch (services/batching.py; the batch's own activities
are activities/provider_batches.py), or runs directly and says why."""

from __future__ import annotations

from pydantic import ValidationError
from temporalio import activity

from activities.adapters.base import AdapterRegistry, InvalidOptions
from activities.adapters.batch import batch_api_of
from activities.adapters.options import PromptOptions, options_of, targets
from activities.contracts import DeferJob, Deferral
from activities.outages import through_outages
from projections.domain.lifecycle import JobState
from projections.models import Job, job_options
from projections.store import JobStore

# How a deferrable job that is not batched says why (on its attempt's `via`).
DIRECTLY = "deferrable, run directly"


class DeferralActivities:
    def __init__(self, store: JobStore, adapters: AdapterRegistry) -> None:
        self.store = store
        self.batches = store.provider_batches
        self.adapters = adapters

    @activity.defn(name="defer_job")
    async def defer_job(self, defer: DeferJob) -> Deferral:
        """Record the job as waiting for a provider batch of its provider and model, unless
        that provider has none (the fake; a compatible server found without one lately):
        then of the next of its places (`options.fallbacks`) whose provider has one, which
        becomes its place; with none, it runs directly where it is, saying why."""
        job, prompt = await through_outages(
            "load job", lambda: self.store.job_and_prompt(defer.job_id)
        )
        options, _ = options_of(job, prompt)
        if job.state is not JobState.QUEUED:
            # Settled meanwhile (cancelled): the workflow's attempt finds it closed.
            return Deferral(False, f"{DIRECTLY}: the job is {job.state.value}")
        own = await self._why_not(options)
        if own is None:
            return await self._defer(job, options, None)
        try:
            places = targets(PromptOptions.model_validate(job_options(job, prompt)))
        except ValidationError:
            return Deferral(False, f"{DIRECTLY}: {own}")
        for step in range(1, len(places)):
            index = (job.fallback + step) % len(places)
            if await self._why_not(places[index]) is None:
                return await self._defer(job, places[index], index)
        return Deferral(False, f"{DIRECTLY}: {own}")

    async def _why_not(self, options: PromptOptions) -> str | None:
        """Why a job with `options` cannot wait for a provider batch (None: it can)."""
        provider = self.adapters.provider_of(options)
        try:
            adapter = self.adapters.get(options)
        except InvalidOptions:
            return f"provider {provider} is not configured here"
        if batch_api_of(adapter) is None:
            return f"provider {provider} has no batch API"
        if not adapter.configured:
            return f"provider {provider} has no credential"
        return await self.batches.unsupported(provider)

    async def _defer(self, job: Job, options: PromptOptions, place: int | None) -> Deferral:
        provider, model = self.adapters.provider_of(options), self.adapters.model_of(options)
        deferred = await self.batches.defer(job, provider, model, place=place)
        if deferred.verdict is not None:
            # A restarted workflow (the reconciler's) of a job its batch is done with: the
            # batch told the workflow that was lost; the job runs (or closes) directly.
            return Deferral(False, f"{DIRECTLY}: its provider batch {deferred.batch_id} ended")
        return Deferral(True)
