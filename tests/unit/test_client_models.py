"""The client's own wire models (clients/python) against the server's OpenAPI document: every
field the server answers with, the client reads; every field the client sends, the server
takes, with the same bounds; the client's enums are the server's. So the two cannot drift,
though the client imports nothing of the server."""

from __future__ import annotations

from typing import Any

import promptjobs_client.models as wire
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from activities.adapters.base import AdapterRegistry
from activities.adapters.fake import FakeAdapter
from api import schemas as api_schemas
from api.openapi import exact_openapi
from api.routes import events, health, jobs, prompts, responses
from projections.domain.lifecycle import EventType, JobState


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    app = FastAPI()
    for module in (prompts, jobs, responses, events, health):
        app.include_router(module.router)
    registry = AdapterRegistry({"fake": FakeAdapter(enabled=True)}, default="fake")
    found: dict[str, Any] = exact_openapi(app, registry.names())["components"]["schemas"]
    return found


# The data of SSE events, which the OpenAPI document does not describe: the server's models.
SSE_DATA = {"OutputChunk": api_schemas.OutputChunk, "OutputReset": api_schemas.OutputReset}


def server_schema(schemas: dict[str, Any], name: str) -> dict[str, Any]:
    """A component by name, whichever of FastAPI's input/output variants it was given (an
    SSE event's data: its model's schema)."""
    if name in SSE_DATA:
        return SSE_DATA[name].model_json_schema(mode="serialization")
    for candidate in (name, f"{name}-Output", f"{name}-Input"):
        if candidate in schemas:
            schema: dict[str, Any] = schemas[candidate]
            return schema
    raise AssertionError(f"no {name} in the OpenAPI document: {sorted(schemas)}")


ANSWERS = [
    wire.JobOut, wire.Accepted, wire.JobList, wire.PromptOut, wire.PromptList, wire.Usage,
    wire.ResponseOut, wire.OutputChunk, wire.OutputReset, wire.OutputOut, wire.AttemptOut,
    wire.AttemptList, wire.FieldError, wire.ProblemDetails,
]  # fmt: skip


@pytest.mark.parametrize("model", ANSWERS, ids=lambda m: m.__name__)
def test_the_client_reads_every_field_the_server_answers_with(
    schemas: dict[str, Any], model: type[BaseModel]
) -> None:
    server = server_schema(schemas, model.__name__)
    assert set(model.model_fields) == set(server["properties"])
    # What the server always sends, the client may require; nothing more.
    required = {name for name, field in model.model_fields.items() if field.is_required()}
    assert required <= set(server.get("required", [])), model.__name__


@pytest.mark.parametrize("model", [wire.SubmitPrompt, wire.RetryJob], ids=lambda m: m.__name__)
def test_the_client_sends_only_what_the_server_takes_within_its_bounds(
    schemas: dict[str, Any], model: type[BaseModel]
) -> None:
    server = server_schema(schemas, model.__name__)
    assert set(model.model_fields) == set(server["properties"])
    assert set(server.get("required", [])) <= {
        name for name, field in model.model_fields.items() if field.is_required()
    }
    ours = model.model_json_schema()["properties"]
    for name in ("priority", "max_attempts"):
        if name in ours:
            assert _bounds(ours[name]) == _bounds(server["properties"][name]), name
    if "after" in ours:
        assert ours["after"]["maxItems"] == server["properties"]["after"]["maxItems"]


def _bounds(schema: dict[str, Any]) -> tuple[Any, Any]:
    for variant in [schema, *schema.get("anyOf", [])]:
        if "minimum" in variant or "maximum" in variant:
            return variant.get("minimum"), variant.get("maximum")
    return None, None


def test_the_clients_enums_are_the_servers() -> None:
    assert {s.value for s in wire.JobState} == {s.value for s in JobState}
    assert {s.value for s in wire.JobState if s.is_terminal} == {
        s.value for s in JobState if s.is_terminal
    }
    assert {e.value for e in wire.EventType} == {e.value for e in EventType}


def test_a_base_url_ending_in_v1_is_refused_saying_what_to_give() -> None:
    from promptjobs_client import PromptJobs, PromptJobsError

    with pytest.raises(PromptJobsError) as refused:
        PromptJobs("http://127.0.0.1:8000/v1/", api_key="pj_x")
    assert "give the server's address, http://127.0.0.1:8000" in str(refused.value)
