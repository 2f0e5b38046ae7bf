"""The usage counters' labels stay bounded: a job's options name its model, so a tenant could
otherwise mint label values without end."""

from __future__ import annotations

import pytest


def test_model_labels_are_bounded_whatever_models_jobs_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from projections import metrics

    # A set of this test's own: the process's labels are not used up for the tests after it.
    monkeypatch.setattr(metrics, "MODEL_LABELS", metrics.BoundedLabels(metrics.MAX_MODEL_LABELS))
    minted = [
        metrics.model_label(f"tenant-model-{i}") for i in range(metrics.MAX_MODEL_LABELS + 50)
    ]
    assert len(set(minted)) <= metrics.MAX_MODEL_LABELS + 1
    assert minted[-1] == "other"


def test_budgets_past_the_label_cap_are_summed_under_other_and_none_is_left_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import UTC, datetime

    from prometheus_client import REGISTRY

    from projections import metrics
    from projections.budgets import BudgetStanding

    monkeypatch.setattr(metrics, "BUDGET_LABELS", metrics.BoundedLabels(metrics.MAX_BUDGET_LABELS))

    def budget(i: int, *, paused: bool = False, rate_limited: int = 0) -> BudgetStanding:
        return BudgetStanding(
            name=f"openai/m{i:03}",
            rpm=10,
            tpm=None,
            own_rpm=None,
            own_tpm=None,
            learned_rpm=10,
            learned_tpm=None,
            requests=1,
            tokens=5,
            reserved=0,
            waiting=0,
            paused_until=datetime.now(UTC) if paused else None,
            rate_limited=rate_limited,
        )

    cap = metrics.MAX_BUDGET_LABELS
    budgets = [budget(i) for i in range(cap + 10)]
    budgets[cap + 3] = budget(cap + 3, paused=True, rate_limited=7)
    metrics.record_budgets(budgets)

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    assert sample("promptjobs_budget_paused", budget="other") == 1
    assert sample("promptjobs_budget_rate_limited", budget="other") == 7
    assert sample("promptjobs_budget_used", budget="other", unit="requests") == 10
    assert sample("promptjobs_budget_limit", budget="other", unit="requests") == 100
    assert sample("promptjobs_budget_paused", budget="openai/m000") == 0

    # Forgotten budgets leave no series behind.
    metrics.record_budgets(budgets[:1])
    assert sample("promptjobs_budget_rate_limited", budget="other") is None
