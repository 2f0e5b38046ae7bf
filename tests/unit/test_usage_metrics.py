"""The usage counters' labels stay bounded: a job's options name its model, so a tenant could
otherwise mint label values without end."""

from __future__ import annotations

import pytest


def test_model_labels_are_bounded_whatever_models_jobs_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from projections import metrics

    # A set of this test's own: the process's labels are not used up for the tests after it.
    monkeypatch.setattr(metrics, "_models", set())
    minted = [
        metrics.model_label(f"tenant-model-{i}") for i in range(metrics.MAX_MODEL_LABELS + 50)
    ]
    assert len(set(minted)) <= metrics.MAX_MODEL_LABELS + 1
    assert minted[-1] == "other"
