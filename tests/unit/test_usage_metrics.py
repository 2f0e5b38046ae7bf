"""The usage counters' labels stay bounded: a job's options name its model, so a tenant could
otherwise mint label values without end."""

from __future__ import annotations


def test_model_labels_are_bounded_whatever_models_jobs_name() -> None:
    from projections import metrics

    minted = [
        metrics.model_label(f"tenant-model-{i}") for i in range(metrics.MAX_MODEL_LABELS + 50)
    ]
    assert len(set(minted)) <= metrics.MAX_MODEL_LABELS + 1
    assert minted[-1] == "other"
