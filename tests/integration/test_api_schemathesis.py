"""Schemathesis against the live API (`promptjobs api` as a process, SQLite, real HTTP): every
documented operation, with valid and invalid inputs, answers as its OpenAPI document says and
never with a server error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import ValidationError
from schemathesis import BaseSchema, GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.schemas import APIOperation
from temporalio.testing import WorkflowEnvironment

from activities.adapters.conversation import (
    InvalidConversation,
    check_conversation,
    parse_messages,
)
from activities.adapters.options import PromptOptions
from api.openai.errors import speaks_openai
from api.schemas import SubmitPrompt
from projections.migrate import migrate
from tests.conftest import free_port

PROMPTJOBS = str(Path(sys.executable).parent / "promptjobs")
EXAMPLES = 15
WEBHOOK_HOST = "hooks.example"


@pytest.fixture(scope="module")
def live_api(
    dev_server: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """`promptjobs api` on a free port, and a member's key made with `promptjobs keys create`."""
    data = tmp_path_factory.mktemp("schemathesis")
    port = free_port()
    env = {
        **os.environ,
        "PROMPTJOBS_DATA_DIR": str(data),
        "PROMPTJOBS_DATABASE_URL": f"sqlite:///{data / 'api.db'}",
        "PROMPTJOBS_API_PORT": str(port),
        "PROMPTJOBS_TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "PROMPTJOBS_TEMPORAL_TASK_QUEUE": f"schemathesis-{port}",
        "PROMPTJOBS_FAKE_ADAPTER": "true",
        # A job's own webhook to this host is allowed unresolved (_a_webhook_it_may_reach).
        "PROMPTJOBS_WEBHOOK_ALLOW_HOSTS": json.dumps([WEBHOOK_HOST]),
    }
    # The store as `promptjobs api` creates it (an operator's command never creates one).
    migrate(env["PROMPTJOBS_DATABASE_URL"])
    created = subprocess.run(
        [PROMPTJOBS, "keys", "create", "--org", "acme", "--user", "alice", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key = json.loads(created.stdout)["key"]
    api = subprocess.Popen([PROMPTJOBS, "api"], env=env)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base_url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert api.poll() is None, "promptjobs api exited"
            assert time.monotonic() < deadline, "promptjobs api did not come up"
            time.sleep(0.1)
        yield base_url, key
    finally:
        api.send_signal(signal.SIGTERM)
        try:
            api.wait(timeout=20)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()


@pytest.fixture(scope="module")
def api_schema(live_api: tuple[str, str]) -> BaseSchema:
    base_url, _key = live_api
    # Unknown query parameters are ignored, as most HTTP APIs do (cache-busters like `?_=1`
    # must not break a poll); bodies, where a typo changes meaning, reject unknown fields.
    config = SchemathesisConfig.from_dict({"generation": {"allow-extra-parameters": False}})
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config)


def test_the_document_describes_every_route(api_schema: BaseSchema) -> None:
    operations = {(op.method.upper(), op.path) for op in _operations(api_schema)}
    assert operations == {
        ("POST", "/v1/prompts"),
        ("GET", "/v1/prompts"),
        ("POST", "/v1/webhooks"),
        ("GET", "/v1/webhooks"),
        ("GET", "/v1/webhooks/{endpoint_id}"),
        ("PATCH", "/v1/webhooks/{endpoint_id}"),
        ("DELETE", "/v1/webhooks/{endpoint_id}"),
        ("POST", "/v1/webhooks/{endpoint_id}/rotate"),
        ("GET", "/v1/webhooks/{endpoint_id}/deliveries"),
        ("POST", "/v1/webhooks/{endpoint_id}/redeliver"),
        ("GET", "/v1/webhooks/default/secret"),
        ("POST", "/v1/webhooks/default/rotate"),
        ("GET", "/v1/prompts/{prompt_id}"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("GET", "/v1/jobs/{job_id}/output"),
        ("GET", "/v1/jobs/{job_id}/attempts"),
        ("POST", "/v1/jobs/{job_id}/cancel"),
        ("POST", "/v1/jobs/{job_id}/retry"),
        ("GET", "/v1/responses/{response_id}"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/responses/{response_id}/cancel"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/chat/completions/{completion_id}"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/{model}"),
        ("POST", "/v1/files"),
        ("GET", "/v1/files"),
        ("GET", "/v1/files/{file_id}"),
        ("GET", "/v1/files/{file_id}/content"),
        ("DELETE", "/v1/files/{file_id}"),
        ("POST", "/v1/batches"),
        ("GET", "/v1/batches"),
        ("GET", "/v1/batches/{batch_id}"),
        ("POST", "/v1/batches/{batch_id}/cancel"),
        ("GET", "/v1/events"),
        ("GET", "/v1/usage"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
    }


# The pytest plugin's lazy loader does not run under pytest 9, so this drives the same
# checks through schemathesis' Python API: one Hypothesis run per operation and mode.
@pytest.mark.timeout(300)  # ~20 s on an idle machine; generous for a shared one
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_conforms_to_the_openapi_document(
    live_api: tuple[str, str], api_schema: BaseSchema, mode: GenerationMode
) -> None:
    # Sent explicitly, so schemathesis also probes each operation without it and with a bad one.
    auth = {"Authorization": f"Bearer {live_api[1]}"}
    for operation in _operations(api_schema):
        if operation.path == "/v1/events":
            continue  # a stream never ends by itself; test_api_events.py covers it
        if speaks_openai(operation.path):
            # OpenAI's contract, not this document's: the official SDK drives it
            # (test_openai_*.py), and a blocking create waits for a worker this API lacks.
            continue
        document = api_schema.raw_schema["paths"][operation.path][operation.method.lower()]
        if mode is GenerationMode.NEGATIVE and not {"parameters", "requestBody"} & document.keys():
            continue  # nothing to get wrong (/healthz, /readyz)

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def conforms(case: schemathesis.Case) -> None:
            if case.headers and "idempotency-key" in {h.lower() for h in case.headers}:
                # Hypothesis repeats values across examples, and a key reused with another
                # body is rightly a 422 (test_api_submit.py); give every example its own key.
                case.headers = {
                    **{k: v for k, v in case.headers.items() if k.lower() != "idempotency-key"},
                    "Idempotency-Key": uuid.uuid4().hex,
                }
            if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
                case.body = _without_nul(case.body)
            if isinstance(case.body, dict):
                # A negative case whose mutation lies elsewhere may be schema-valid here, and
                # is checked as a valid request is (seen once the document gained fallbacks).
                case.body = _a_conversation_the_rules_allow(_within_schedule_horizon(case.body))
                case.body = _a_webhook_it_may_reach(case.body)
            case.call_and_validate(headers=auth, timeout=10)

        conforms()


def _within_schedule_horizon(body: dict[str, Any]) -> dict[str, Any]:
    """`scheduled_for` may be at most SCHEDULE_HORIZON ahead of now, which a JSON Schema cannot
    say (test_api_submit.py covers the 422): a generated time the API's own rule refuses is
    sent as none (any other fault of it is left for the API to refuse)."""
    when = body.get("scheduled_for")
    if when is None:
        return body
    try:
        SubmitPrompt.model_validate({"prompt": "x", "scheduled_for": when})
    except ValidationError as err:
        if {e["type"] for e in err.errors()} & {"scheduled_too_far", "datetime_out_of_range"}:
            return {**body, "scheduled_for": None}
    return body


def _a_webhook_it_may_reach(body: dict[str, Any]) -> dict[str, Any]:
    """Whether a job's `webhook` may be sent to depends on where its host resolves, which a
    JSON Schema cannot say (test_webhooks.py covers the 422): a generated string is sent as a
    URL on a host the operator allows."""
    if isinstance(body.get("webhook"), str):
        return {**body, "webhook": f"https://{WEBHOOK_HOST}/hook"}
    return body


def _without_nul(value: Any) -> Any:
    """The generator's regex strategy lets a NUL through `^[^\\x00]*$` after a surrogate pair
    (seen 2026-12-07, once the document's shape moved the derandomized sequence there); the
    API refuses NUL, as the pattern says (test_api_submit.py covers the 422): a positive
    case's strings are sent without it."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {k: _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value


TOOL_FIELDS = ("tools", "tool_choice", "output_schema")


def _a_conversation_the_rules_allow(body: dict[str, Any]) -> dict[str, Any]:
    """The rules across a conversation's messages and tools, which a JSON Schema cannot say
    (a user message in it, an assistant message that says something, a tool message that
    answers a call, arguments and parameters that are JSON and JSON Schema, a chosen tool
    among those offered, an output schema that is JSON Schema; test_conversations.py and
    test_structured_output.py cover their 422s): generated messages that break them are
    sent as one user message, and tools or an output schema that do as none."""
    options = body.get("options")
    if isinstance(options, dict) and TOOL_FIELDS & options.keys():
        try:
            PromptOptions.model_validate({k: v for k, v in options.items() if k in TOOL_FIELDS})
        except ValidationError:
            kept = {k: v for k, v in options.items() if k not in TOOL_FIELDS}
            body = {**body, "options": kept}
    if "messages" in body:
        try:
            check_conversation(parse_messages(body["messages"]))
        except InvalidConversation:
            body = {**body, "messages": [{"role": "user", "content": "x"}]}
    return body


def _operations(schema: BaseSchema) -> list[APIOperation]:
    return [result.ok() for result in schema.get_all_operations()]
