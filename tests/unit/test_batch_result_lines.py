"""A provider batch's result lines read one at a time: a line that cannot be read costs its
own job alone, and a step's unclassified failure is retried a bounded number of times."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.adapters.batch import LineResult, UnreadableLine, read_result_line
from activities.errors import AdapterError
from activities.provider_batches import UNKNOWN_TRIES, gave_up_on
from projections.domain.lifecycle import ErrorKind


def read(custom_id: str, row: dict[str, Any]) -> LineResult:
    return LineResult(custom_id, error=AdapterError(ErrorKind.UNKNOWN, row["answer"]))


def test_a_readable_line_is_read_by_its_provider() -> None:
    line = read_result_line("p", json.dumps({"custom_id": "job_1", "answer": "x"}), read)
    assert isinstance(line, LineResult) and line.custom_id == "job_1"
    assert line.error is not None and line.error.message == "x"


def test_a_line_cut_short_after_its_custom_id_fails_that_job_as_parse() -> None:
    line = read_result_line("p", '{"custom_id": "job_2", "respo', read)
    assert isinstance(line, LineResult) and line.custom_id == "job_2"
    assert line.error is not None and line.error.kind is ErrorKind.PARSE


def test_a_line_its_provider_cannot_read_fails_that_job_as_parse() -> None:
    line = read_result_line("p", json.dumps({"custom_id": "job_3"}), read)
    assert isinstance(line, LineResult) and line.error is not None
    assert line.error.kind is ErrorKind.PARSE


@pytest.mark.parametrize("text", ['{"id": "batch_req_cut", "respo', "[1, 2]", '{"custom_id": 7}'])
def test_a_line_that_names_no_job_is_unreadable(text: str) -> None:
    assert isinstance(read_result_line("p", text, read), UnreadableLine)


@pytest.mark.parametrize(
    ("attempt", "err", "expected"),
    [
        (1, ValueError("no"), False),
        (UNKNOWN_TRIES, ValueError("no"), True),
        (UNKNOWN_TRIES, AdapterError(ErrorKind.PROVIDER_5XX, "down"), False),
    ],
)
def test_a_batch_step_gives_up_on_an_unknown_failure_only(
    attempt: int, err: Exception, expected: bool
) -> None:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    assert env.run(gave_up_on, err) is expected
