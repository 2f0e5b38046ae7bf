"""Streamed output and usage in the projection, on SQLite and PostgreSQL: a batch lands once at
its offset, a stale attempt's is refused, a new attempt resets the text, and an attempt's usage
is recorded once, summed on the job (unknown cost stays unknown)."""

from __future__ import annotations

from datetime import UTC, datetime

from projections.domain.lifecycle import EventType, JobState
from projections.projector import Transition
from projections.scope import Scope
from projections.streams import AttemptUsage, OutputBatch
from projections.writes import Submission
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

ALICE = Scope("acme", "alice", "member")
NOW = datetime(2026, 12, 4, tzinfo=UTC)


async def running_job(projection: Projection, attempt: int = 1) -> str:
    accepted = await projection.store.submit(ALICE, Submission("hello", 50, 3, {}))
    job_id = accepted.job.job_id
    await projection.projector.start_attempt(job_id, attempt, "w1")
    return job_id


async def text_of(projection: Projection, job_id: str) -> tuple[int, str]:
    output = await projection.store.output(ALICE, job_id, 0)
    return output.attempt, output.text


def usage(job_id: str, attempt: int, cost: float | None, tokens: int = 10) -> AttemptUsage:
    return AttemptUsage(
        job_id=job_id,
        attempt=attempt,
        org="acme",
        outcome="provider_5xx",
        provider="fake",
        model="fake-1",
        input_tokens=tokens,
        output_tokens=2 * tokens,
        usage_estimated=False,
        cost_usd=cost,
        output_chars=0,
        first_token_ms=None,
        duration_ms=5,
        started_at=NOW,
        ended_at=NOW,
    )


async def test_a_batch_lands_once_at_its_offset(projection: Projection) -> None:
    job_id = await running_job(projection)
    append = projection.projector.append_outputs
    [first] = await append([OutputBatch(job_id, 1, 0, "Hello, ")])
    assert first.applied and first.running
    # Repeated (its commit went unacknowledged), and repeated with more text after it.
    [again] = await append([OutputBatch(job_id, 1, 0, "Hello, ")])
    assert not again.applied
    [more] = await append([OutputBatch(job_id, 1, 0, "Hello, world")])
    assert more.applied
    [gap] = await append([OutputBatch(job_id, 1, 20, "!")])
    assert not gap.applied
    assert await text_of(projection, job_id) == (1, "Hello, world")
    logged = await projection.store.job_events(ALICE, job_id, kinds=(EventType.OUTPUT,))
    assert [(e.data["offset"], e.data["text"]) for e in logged] == [(0, "Hello, "), (7, "world")]
    assert {e.state for e in logged} == {JobState.RUNNING}


async def test_a_new_attempt_resets_the_text_and_a_stale_one_is_refused(
    projection: Projection,
) -> None:
    job_id = await running_job(projection)
    await projection.projector.append_outputs([OutputBatch(job_id, 1, 0, "half an ans")])
    requeue = Transition(job_id, JobState.QUEUED, 1, next_attempt_at=NOW)
    await projection.projector.apply(requeue)
    await projection.projector.start_attempt(job_id, 2, "w2")
    assert await text_of(projection, job_id) == (2, "")
    [stale] = await projection.projector.append_outputs([OutputBatch(job_id, 1, 11, "wer")])
    assert not stale.applied and not stale.running
    [fresh] = await projection.projector.append_outputs([OutputBatch(job_id, 2, 0, "whole")])
    assert fresh.applied and fresh.running
    kinds = [
        (e.type, e.data["attempt"])
        for e in await projection.store.job_events(ALICE, job_id, kinds=tuple(EventType))
        if e.type != EventType.STATE_CHANGED
    ]
    assert kinds == [
        (EventType.OUTPUT, 1),
        (EventType.OUTPUT_RESET, 2),
        (EventType.OUTPUT, 2),
    ]


def call(arguments: str, call_id: str = "call_1") -> dict[str, str]:
    return {"id": call_id, "name": "weather", "arguments": arguments}


async def test_tool_calls_stream_as_whole_snapshots_that_only_grow(
    projection: Projection,
) -> None:
    job_id = await running_job(projection)
    append = projection.projector.append_outputs
    [text] = await append([OutputBatch(job_id, 1, 0, "Let me look.")])
    # The calls begin with no new text; a later snapshot lengthens the arguments.
    [begun] = await append([OutputBatch(job_id, 1, 12, "", [call('{"ci')])])
    [grown] = await append([OutputBatch(job_id, 1, 12, "", [call('{"city": "Oslo"}')])])
    # A batch written late (its commit went unacknowledged) takes nothing back.
    [late] = await append([OutputBatch(job_id, 1, 12, "", [call('{"ci')])])
    # Text that goes on keeps the calls stored.
    [more] = await append([OutputBatch(job_id, 1, 12, " Done.")])
    assert [w.applied for w in (text, begun, grown, late, more)] == [True, True, True, False, True]
    output = await projection.store.output(ALICE, job_id, 0)
    assert (output.text, output.tool_calls) == ("Let me look. Done.", [call('{"city": "Oslo"}')])
    logged = await projection.store.job_events(ALICE, job_id, kinds=(EventType.OUTPUT,))
    assert [e.data.get("tool_calls") for e in logged] == [
        None,
        [call('{"ci')],
        [call('{"city": "Oslo"}')],
        None,
    ]

    # A new attempt starts over: the reset clears the calls too.
    await projection.projector.apply(Transition(job_id, JobState.QUEUED, 1, next_attempt_at=NOW))
    await projection.projector.start_attempt(job_id, 2, "w2")
    output = await projection.store.output(ALICE, job_id, 0)
    assert (output.attempt, output.text, output.tool_calls) == (2, "", None)
    [first] = await append([OutputBatch(job_id, 2, 0, "", [call("", "call_9")])])
    assert first.applied
    output = await projection.store.output(ALICE, job_id, 0)
    assert output.tool_calls == [call("", "call_9")]


async def test_usage_is_recorded_once_and_an_unknown_cost_stays_unknown(
    projection: Projection,
) -> None:
    job_id = await running_job(projection)
    requeue = Transition(job_id, JobState.QUEUED, 1, next_attempt_at=NOW)
    await projection.projector.apply(requeue, usage=usage(job_id, 1, 0.25))
    await projection.projector.apply(requeue, usage=usage(job_id, 1, 0.25))  # repeated
    row = await projection.store.job(ALICE, job_id)
    assert (row.input_tokens, row.output_tokens, row.cost_usd) == (10, 20, 0.25)
    # The re-queue's event carries the sums.
    events = await projection.store.job_events(ALICE, job_id)
    assert events[-1].data["cost_usd"] == 0.25

    await projection.projector.start_attempt(job_id, 2, "w1")
    await projection.projector.apply(Transition(job_id, JobState.CANCELLED))
    # The cancelled call's usage lands after the cancel: a job.usage event carries it.
    await projection.projector.end_attempt(None, usage(job_id, 2, None, tokens=1))
    row = await projection.store.job(ALICE, job_id)
    assert (row.input_tokens, row.output_tokens, row.cost_usd) == (11, 22, None)
    *_, last, done = await projection.store.job_events(ALICE, job_id, kinds=tuple(EventType))
    assert last.type == EventType.USAGE and last.data["output_tokens"] == 22
    assert row.last_event_id == last.id
    # ...and the job's record is complete only now: its stream ends here.
    assert done.type == EventType.DONE and done.data["output_tokens"] == 22
    _job, attempts = await projection.store.attempts(ALICE, job_id)
    assert [(a.attempt, a.cost_usd) for a in attempts] == [(1, 0.25), (2, None)]


async def test_one_flush_writes_the_text_of_many_jobs(projection: Projection) -> None:
    first, second = await running_job(projection), await running_job(projection)
    written = await projection.projector.append_outputs(
        [
            OutputBatch(first, 1, 0, "one "),
            OutputBatch(second, 1, 0, "two "),
            OutputBatch(first, 1, 4, "three"),  # the same job again, later in the flush
            OutputBatch(second, 2, 0, "stale"),  # not the attempt its row runs
            OutputBatch("job_gone", 1, 0, "?"),
        ]
    )
    assert [(w.applied, w.running) for w in written] == [
        (True, True),
        (True, True),
        (True, True),
        (False, False),
        (False, False),
    ]
    assert await text_of(projection, first) == (1, "one three")
    assert await text_of(projection, second) == (1, "two ")
    logged = await projection.store.job_events(ALICE, first, kinds=(EventType.OUTPUT,))
    assert [e.data["offset"] for e in logged] == [0, 4]
