"""A submission's rules (services/jobs.py `JobService.check` and `check_budget`), the same for
every door: `/v1/prompts`, the OpenAI routes and each `/v1/batches` line. No service runs:
the rules need the adapters and, for the budget, the store."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities.adapters.base import InvalidOptions
from activities.adapters.options import PromptOptions
from projections.budgets import OverBudget
from projections.domain.chains import UnknownPlaceholder
from projections.domain.errors import PromptTooLarge, Refused
from projections.writes import Submission
from promptjobs.runtime import Projection, build_adapters
from services.jobs import JobService
from tests.conftest import make_settings

LIMIT = 64


def rules(projection: Projection, tmp_path: Path) -> JobService:
    settings = make_settings(tmp_path, max_prompt_bytes=LIMIT, max_attempts_default=4)
    return JobService(
        projection.store,
        None,  # type: ignore[arg-type]  # the rules start no workflow
        build_adapters(settings),
        max_attempts_default=settings.max_attempts_default,
        max_prompt_bytes=settings.max_prompt_bytes,
    )


def submission(text: str = "hello", **changes: object) -> Submission:
    values: dict[str, object] = {
        "text": text,
        "priority": 50,
        "max_attempts": None,
        "options": {"provider": "fake"},
        **changes,
    }
    return Submission(**values)  # type: ignore[arg-type]


async def test_a_submission_that_passes_gets_the_default_attempts(
    projection: Projection, tmp_path: Path
) -> None:
    jobs = rules(projection, tmp_path)
    checked = jobs.check(submission("é" * 32, options={"provider": "fake", "max_tokens": 9}))
    assert (checked.submission.max_attempts, checked.options.max_tokens) == (4, 9)
    assert jobs.check(submission(max_attempts=2)).submission.max_attempts == 2


async def test_the_size_counts_the_system_text_and_each_door_words_it(
    projection: Projection, tmp_path: Path
) -> None:
    jobs = rules(projection, tmp_path)
    with pytest.raises(PromptTooLarge) as alone:
        jobs.check(submission("é" * 33))
    assert (alone.value.size, alone.value.limit) == (66, LIMIT)
    with pytest.raises(PromptTooLarge) as with_system:
        jobs.check(submission("x" * 40, options={"provider": "fake", "system": "y" * 30}))
    assert with_system.value.worded("the prompt", "options.system") == (
        "the prompt and options.system are 70 bytes of UTF-8; the limit is 64: "
        "send a shorter prompt"
    )
    assert with_system.value.worded("the input", "instructions").startswith(
        "the input and instructions are 70 bytes"
    )


async def test_options_and_placeholders_are_refused_saying_what_to_fix(
    projection: Projection, tmp_path: Path
) -> None:
    jobs = rules(projection, tmp_path)
    with pytest.raises(InvalidOptions, match="unknown provider 'nope'"):
        jobs.check(submission(options={"provider": "nope"}))
    with pytest.raises(UnknownPlaceholder, match=r"\{\{after\[0\]\}\}"):
        jobs.check(submission("use {{after[0]}}"))
    checked = jobs.check(submission("use {{after[0]}}", after=("pmt_1",)))
    assert checked.submission.after == ("pmt_1",)


async def test_a_job_over_its_provider_budget_alone_is_refused(
    projection: Projection, tmp_path: Path
) -> None:
    jobs = rules(projection, tmp_path)
    await projection.store.budgets.set_limits("fake/fake-1", None, 10, datetime.now(UTC))
    fake = PromptOptions(provider="fake")
    await jobs.check_budget("short", fake)
    with pytest.raises(OverBudget) as over:
        await jobs.check_budget("x" * 60, fake)
    assert (over.value.budget, over.value.tpm) == ("fake/fake-1", 10)


def test_every_refusal_has_the_one_base_and_a_code() -> None:
    from api.problems import REFUSALS

    for kind in REFUSALS:
        assert issubclass(kind, Refused)
        assert kind.code != Refused.code, kind
