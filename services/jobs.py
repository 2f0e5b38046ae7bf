"""Job actions shared by every door (the HTTP routes, the OpenAI routes, a `/v1/batches`
line, the CLI): submit, cancel, retry. A submission's rules live here, once: its size, its
options against the adapters, its provider budget and its chain placeholders; a door
translates its wire shape into a `Submission` and nothing else."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace

from activities.adapters.base import AdapterRegistry
from activities.adapters.conversation import (
    ImagesTooLarge,
    check_conversation,
    count_images,
    image_bytes,
    images_of,
    parse_messages,
    transcript,
    user_texts,
)
from activities.adapters.options import PromptOptions
from activities.budgets import least_tokens
from activities.stale import AtMostEvery
from projections import metrics
from projections.budgets import OverBudget, budget_name
from projections.domain.chains import check_placeholders
from projections.domain.errors import check_size
from projections.models import Batch, Job
from projections.openai_batches import Line
from projections.scope import Scope
from projections.store import JobStore
from projections.writes import RetryChanges, Submission, Submitted
from services.dispatch import Dispatcher
from services.spend import SpendGate

log = logging.getLogger("promptjobs.jobs")


@dataclass(frozen=True)
class Checked:
    """A submission that passed its rules, and its options as their model."""

    submission: Submission
    options: PromptOptions
    # The conversation's images (a budget's estimate counts them).
    images: int = 0


# How stale the budgets' token limits a submission is checked against may be.
BUDGETS_READ_S = 5.0


class JobService:
    def __init__(
        self,
        store: JobStore,
        dispatcher: Dispatcher,
        adapters: AdapterRegistry,
        *,
        max_attempts_default: int,
        max_prompt_bytes: int,
        max_image_bytes: int = 10_000_000,
        metrics_org_labels: bool = False,
        max_jobs_per_prompt: int | None = None,
        spend: SpendGate | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.adapters = adapters
        self.max_attempts_default = max_attempts_default
        self.max_prompt_bytes = max_prompt_bytes
        self.max_image_bytes = max_image_bytes
        self.metrics_org_labels = metrics_org_labels
        self.max_jobs_per_prompt = max_jobs_per_prompt
        # The spend caps at the door (None: none checked, as in tests of the rules alone).
        self.spend = spend
        self._token_limits: dict[str, int] = {}
        # One read at a time, whatever the requests in flight: a burst does not read 32 times.
        self._read_budgets = AtMostEvery(BUDGETS_READ_S, self._read_token_limits)

    def check(self, submission: Submission) -> Checked:
        """The submission as it will be recorded (the default attempts filled in) and its
        options parsed into their model, or the Refused that says why it never could run:
        PromptTooLarge, InvalidOptions, InvalidConversation, ImagesTooLarge,
        UnknownPlaceholder. A conversation's `text` becomes its transcript. The provider budget is
        `check_budget`'s (it reads the store)."""
        placed = submission.text
        images = 0
        if submission.messages is not None:
            messages = parse_messages(submission.messages)
            check_conversation(messages)
            if (inline := image_bytes(messages)) > self.max_image_bytes:
                raise ImagesTooLarge(inline, self.max_image_bytes)
            images = len(images_of(messages))
            placed = user_texts(messages)
            submission = replace(submission, text=transcript(messages))
        # A route the job names is stored as what it named then (its places).
        submission = replace(submission, options=self.adapters.expand(submission.options))
        system = submission.options.get("system")
        check_size(
            submission.text, system if isinstance(system, str) else None, self.max_prompt_bytes
        )
        options = self.adapters.parse(submission.options)
        check_placeholders(placed, submission.after)
        if submission.max_attempts is None:
            submission = replace(submission, max_attempts=self.max_attempts_default)
        return Checked(submission, options, images)

    def validate_options(self, options: Mapping[str, Any]) -> None:
        """Raise InvalidOptions now rather than fail the job minutes later."""
        self.adapters.validate(options)

    async def check_budget(self, text: str, options: PromptOptions, images: int = 0) -> None:
        """Raise OverBudget if the job's call alone needs more tokens than its provider budget
        has in a minute (the budgets' limits are read at most every BUDGETS_READ_S)."""
        await self._read_budgets()
        if not self._token_limits:
            return
        name = budget_name(self.adapters.provider_of(options), self.adapters.model_of(options))
        tpm = self._token_limits.get(name)
        if tpm is not None and (needed := least_tokens(self.adapters, text, options, images)) > tpm:
            raise OverBudget(name, needed, tpm)

    async def _read_token_limits(self) -> None:
        self._token_limits = await self.store.budgets.token_limits()

    async def submit(self, scope: Scope, submission: Submission) -> Submitted:
        """Check the submission (`check`, then its budget) and record the prompt and its
        queued job: the commit is the acceptance; the dispatcher starts its workflow."""
        checked = self.check(submission)
        await self.check_budget(checked.submission.text, checked.options, checked.images)
        if self.spend is not None:
            await self.spend.check(scope, checked.submission.text, checked.options, checked.images)
        accepted = await self.store.submit(scope, checked.submission)
        # On the request's span (a no-op span while tracing is off).
        trace.get_current_span().set_attributes(
            {
                "promptjobs.job_id": accepted.job.job_id,
                "promptjobs.prompt_id": accepted.prompt.prompt_id,
                "promptjobs.org": scope.org,
            }
        )
        if accepted.created:
            # An empty label is no label to Prometheus: no tenant named unless asked for.
            org = scope.org if self.metrics_org_labels else ""
            metrics.SUBMISSIONS.labels(org=org).inc()
            self.dispatcher.kick(accepted.job)
        return accepted

    async def submit_lines(self, batch: Batch, first: int, lines: list[Line]) -> bool:
        """Record a `/v1/batches` batch's lines from `first` on, each as a prompt and its
        queued job, in one transaction (their submissions passed `check` as they were read);
        False if another process accepted them first. A line over its provider budget was
        refused when the batch was validated; one over it now (a budget set meanwhile) is
        logged and accepted: the batch's lines are accepted whole."""
        for line in lines:
            options = self.adapters.parse(line.submission.options)  # it passed `check`
            try:
                images = count_images(line.submission.messages)
                await self.check_budget(line.submission.text, options, images)
            except OverBudget as err:
                log.warning("batch %s line %d: %s", batch.batch_id, line.line, err)
        return await self.store.batches.accept(batch, first, lines)

    async def cancel(self, scope: Scope, job_id: str, *, wait: bool = False) -> Job:
        """Record the cancel and hand it to Temporal. `wait` delivers it before returning
        (raising TemporalUnreachable, the request still recorded) for a caller about to exit."""
        job, needs_workflow = await self.store.request_cancel(scope, job_id)
        if needs_workflow:
            if wait:
                await self.dispatcher.cancel_now(job.job_id)
            else:
                self.dispatcher.kick_cancel(job)
        return job

    async def retry(
        self,
        scope: Scope,
        job_id: str,
        changes: RetryChanges | None = None,
        *,
        wait: bool = False,
    ) -> Job:
        if changes is not None and changes.options is not None:
            expanded = self.adapters.expand(changes.options)
            self.validate_options(expanded)
            changes = replace(changes, options=expanded)
        job = await self.store.retry(scope, job_id, changes, max_jobs=self.max_jobs_per_prompt)
        if wait:
            await self.dispatcher.start_now(job)
        else:
            self.dispatcher.kick(job)
        return job
