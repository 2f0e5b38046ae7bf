"""Unit tests of the API's wire rules: request models, problem messages, the OpenAPI document,
the change feed."""

from __future__ import annotations

import asyncio
from dataclasses import fields
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from activities.adapters.base import AdapterRegistry
from activities.adapters.fake import FakeAdapter
from api.changes import WAKE_TURN, ChangeFeed, StreamScope, Subscription
from api.openapi import exact_openapi
from api.problems import CURSOR_HINT, PROBLEM_JSON, validation_problem
from api.routes import events, health, jobs, prompts, responses
from api.schemas import USAGE_FIELDS, ResponseOut, SubmitPrompt
from projections.domain.lifecycle import AttemptResult, JobState
from projections.models import JobEvent, Response
from tests.conftest import eventually


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "priority": 41.0},
        {"prompt": "x", "max_attempts": 10, "options": {"fake": {"latency_ms": 0}}},
        {"prompt": "x", "scheduled_for": "2030-01-01T00:00:00+02:00"},
        {"prompt": "x", "options": {"temperature": 1, "fake": {"fail": ["rate_limit"]}}},
    ],
)
def test_json_typed_bodies_are_accepted(body: dict[str, Any]) -> None:
    SubmitPrompt.model_validate(body)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"prompt": "x", "priority": "41"}, "int_type"),
        ({"prompt": "x", "priority": True}, "int_type"),
        ({"prompt": "x", "priority": 4.5}, "int_from_float"),
        ({"prompt": 7}, "string_type"),
        ({"prompt": "x", "scheduled_for": 1_900_000_000}, "datetime_type"),
        ({"prompt": "x", "options": {"fake": {"latency_ms": "5"}}}, "int_type"),
        ({"prompt": "x", "options": {"seeds": 1}}, "extra_forbidden"),
        ({"prompt": "x", "options": {"seed": "1"}}, "int_type"),
    ],
)
def test_coercions_json_does_not_make_are_refused(body: dict[str, Any], kind: str) -> None:
    with pytest.raises(ValidationError) as raised:
        SubmitPrompt.model_validate(body)
    assert raised.value.errors()[0]["type"] == kind


def test_options_are_kept_as_sent() -> None:
    body = SubmitPrompt.model_validate({"prompt": "x", "options": {"fake": {"fail": ["parse"]}}})
    assert body.options_as_sent() == {"fake": {"fail": ["parse"]}}


def test_problem_messages_say_what_to_fix() -> None:
    malformed = validation_problem(
        [{"type": "json_invalid", "loc": ("body", 14), "msg": "JSON decode error",
          "ctx": {"error": "Expecting value"}}]
    )  # fmt: skip
    assert malformed.body.code == "invalid_json"
    assert malformed.body.detail == (
        "the request body is not valid JSON (Expecting value at character 14)"
    )

    empty = validation_problem([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    assert "the request body is empty" in empty.body.detail

    extra = validation_problem(
        [{"type": "extra_forbidden", "loc": ("body", "colour"), "msg": "Extra inputs"}]
    )
    assert extra.body.errors[0].field == "body.colour"
    assert "unknown field: remove it" in extra.body.detail

    cursor = validation_problem(
        [{"type": "string_pattern_mismatch", "loc": ("header", "Last-Event-ID"), "msg": "x",
          "ctx": {"pattern": "^[0-9]{1,18}$"}}]
    )  # fmt: skip
    assert cursor.body.errors[0].message == CURSOR_HINT


def test_the_openapi_document_types_every_error_as_problem_json() -> None:
    app = FastAPI()
    for module in (prompts, jobs, responses, events, health):
        app.include_router(module.router)
    registry = AdapterRegistry({"fake": FakeAdapter(enabled=True)}, default="fake")

    document = exact_openapi(app, registry.names())

    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")) and path != "/readyz":
                    assert list(response["content"]) == [PROBLEM_JSON], (method, path, status)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    provider = document["components"]["schemas"]["PromptOptions"]["properties"]["provider"]
    assert provider["anyOf"][0]["enum"] == ["fake"]


def test_the_openapi_document_says_a_chain_names_each_parent_once() -> None:
    # Schemathesis (many examples) found `after` refused with a repeat the document allowed.
    schema = SubmitPrompt.model_json_schema()["properties"]["after"]
    assert schema["uniqueItems"] is True
    with pytest.raises(ValidationError, match="listed twice"):
        SubmitPrompt.model_validate({"prompt": "x", "after": ["pmt_a", "pmt_a"]})


def _event(event_id: int, org: str, author: str = "alice") -> JobEvent:
    return JobEvent(
        id=event_id, type="job.state_changed", job_id=f"job{event_id}", prompt_id="p",
        org=org, author=author, state=JobState.QUEUED, data={},
    )  # fmt: skip


def _feed_over(log: list[JobEvent]) -> ChangeFeed:
    """A change feed whose reader reads `log` (every API key stands)."""
    feed = ChangeFeed(poll_interval_s=0.01)

    async def read_after(after: int, limit: int) -> list[JobEvent]:
        return [e for e in log if e.id > after][:limit]

    async def newest() -> int:
        return log[-1].id if log else 0

    async def live(keys: set[str]) -> set[str]:
        return keys

    feed.attach(read_after, newest, live)
    return feed


async def test_change_feed_reader_finds_commits_it_was_not_told_of_and_routes_them() -> None:
    log: list[JobEvent] = []
    feed = _feed_over(log)

    async def reading() -> bool:
        return feed.reading_now

    acme = await feed.subscribe(StreamScope("acme"), "k1")
    bob = await feed.subscribe(StreamScope("acme", author="bob"), "k2")
    # Another process commits: nobody calls notify(), the reader's poll finds them.
    log.extend([_event(1, "acme"), _event(2, "globex"), _event(3, "acme", "bob")])
    assert [e.id for e in await acme.take(5)] == [1, 3]
    assert [e.id for e in await bob.take(5)] == [3]
    feed.unsubscribe(acme)
    feed.unsubscribe(bob)
    # With no stream left, the reader stops by itself.
    await eventually(reading, lambda active: not active)


async def test_a_fan_out_wakes_its_streams_in_turns_and_each_gets_every_event() -> None:
    # Hundreds of streams woken at once would hold the event loop until each had written;
    # in turns of WAKE_TURN, the loop's other work (a submit's next step) runs in between.
    log: list[JobEvent] = []
    feed = _feed_over(log)
    subs = [await feed.subscribe(StreamScope("acme"), f"k{i}") for i in range(3 * WAKE_TURN)]
    served: list[list[int]] = []

    async def stream(sub: Subscription) -> None:
        served.append([e.id for e in await sub.take(5)])

    streams = [asyncio.create_task(stream(sub)) for sub in subs]
    await asyncio.sleep(0)  # every stream waits for its events
    log.extend([_event(1, "acme"), _event(2, "acme")])
    feed.notify()
    seen: list[int] = []  # how many streams were served each time this task ran
    while len(served) < len(subs):
        await asyncio.sleep(0)
        seen.append(len(served))
    await asyncio.gather(*streams)
    assert served == [[1, 2]] * len(subs)
    assert any(0 < n < len(subs) for n in seen), seen
    for sub in subs:
        feed.unsubscribe(sub)


def test_every_attempt_result_field_reaches_the_api_response() -> None:
    """One result record (issue 15): a field added to AttemptResult (and its column) must be
    in ResponseOut too, or this fails naming it."""
    exposed = set(ResponseOut.model_fields) | set(USAGE_FIELDS)
    missing = {f.name for f in fields(AttemptResult)} - exposed
    assert not missing, f"ResponseOut lacks AttemptResult fields: {sorted(missing)}"
    columns = set(Response.__table__.columns.keys())
    assert {f.name for f in fields(AttemptResult)} <= columns
