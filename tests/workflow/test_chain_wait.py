"""A chain's child on the time-skipping server: its wait for its parents, in skipped time."""

from __future__ import annotations

from activities.adapters.fake import fake_output
from projections.domain.lifecycle import ErrorKind, JobState
from tests.workflow.conftest import OWNER, Harness


async def test_a_child_whose_parent_already_succeeded_runs_at_once(harness: Harness) -> None:
    parent = await harness.submit("parent")
    async with harness.worker():
        assert (await harness.run(parent)).state is JobState.SUCCEEDED
        child = await harness.submit("child of {{after[0]}}", after=[parent.prompt_id])
        assert child.waiting_on == [parent.prompt_id]
        result = await harness.run(child)
    assert result.state is JobState.SUCCEEDED
    done = await harness.job(child.job_id)
    assert done.waiting_on is None
    response = await harness.projection.store.response(OWNER, str(done.response_id))
    assert response.text == fake_output(f"child of {fake_output('parent')}")


async def test_a_child_waits_out_its_ceiling_when_its_parent_never_succeeds(
    harness: Harness,
) -> None:
    parent = await harness.submit("parent", fake={"fail": ["auth"]})
    async with harness.worker():
        assert (await harness.run(parent)).state is JobState.FAILED
        child = await harness.submit("{{after[0]}}", after=[parent.prompt_id])
        # A short real ceiling, as for a hanging call (tests/workflow: the test server does
        # not skip this wait reliably); no attempt is ever made.
        harness.dispatcher.ceiling_s = 3
        result = await harness.run(child)
    assert (result.state, result.error_kind) == (JobState.FAILED, ErrorKind.STUCK)
    job = await harness.job(child.job_id)
    assert job.attempt == 0 and job.started_at is None
    assert f"{parent.prompt_id} (job {parent.job_id} failed)" in (job.error_message or "")
    assert await harness.states(child.job_id) == ["queued", "failed"]
