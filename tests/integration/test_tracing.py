"""One submission, one trace: the API (this process, an in-memory exporter) and a real
`promptjobs worker` process (exporting OTLP/HTTP to a receiver this test runs), joined by the
trace context Temporal carries in its headers."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from promptjobs.tracing import redact_secrets, start_tracing
from tests.conftest import (
    MockProviderServer,
    free_port,
    make_settings,
    provider_settings,
    running_stack,
)
from tests.integration.processes import process_env, promptjobs_process, temporal_address


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A minimal OTLP/HTTP trace receiver: every span it is sent, as a dict."""
    spans: list[dict[str, Any]] = []

    class Receive(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex() or None,
                                "attributes": {
                                    a.key: getattr(a.value, a.value.WhichOneof("value"))
                                    for a in span.attributes
                                },
                            }
                        )
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Receive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", spans
    finally:
        server.shutdown()
        server.server_close()


async def test_one_submission_is_one_trace_across_api_and_worker_processes(
    dev_server: WorkflowEnvironment, mock_provider: MockProviderServer, tmp_path: Path
) -> None:
    settings = provider_settings(
        tmp_path,
        mock_provider,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        temporal_address=temporal_address(dev_server),
    )
    memory = InMemorySpanExporter()
    tracing = start_tracing(settings, "api", exporter=memory, install_globally=False)
    assert tracing is not None
    client = Client(**{**dev_server.client.config(), "interceptors": tracing.interceptors()})
    with otlp_receiver() as (endpoint, worker_spans):
        env = process_env(
            settings,
            openai_base_url=settings.openai_base_url,
            openai_api_key="mock-key",
            provider_timeout_s=5,
        )
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        env["OTEL_SERVICE_NAME"] = "worker-under-test"
        async with running_stack(settings, client, run_worker=False, tracing=tracing) as stack:
            with promptjobs_process("worker", env, tmp_path / "worker") as worker:
                await worker.ready()
                accepted = await stack.submit("traced", options={"provider": "openai"})
                job = await stack.settled(accepted["job_id"])
                assert job["state"] == "succeeded"
                worker.terminate()  # its tracer provider exports what is buffered on the way out
                assert await worker.exited() == 0, worker.output()
        tracing.shutdown()

    api_spans = [
        {
            "name": span.name,
            "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
            "attributes": dict(span.attributes or {}),
        }
        for span in memory.get_finished_spans()
    ]
    submit = [s for s in api_spans if s["name"] == "POST /v1/prompts" and s["parent_id"] is None]
    (root,) = submit
    assert root["attributes"]["promptjobs.job_id"] == accepted["job_id"]
    assert root["attributes"]["promptjobs.org"] == "acme"
    trace = [s for s in api_spans + worker_spans if s["trace_id"] == root["trace_id"]]
    names = [s["name"] for s in trace]
    for expected in (
        "StartWorkflow:PromptJobWorkflow",
        "RunWorkflow:PromptJobWorkflow",
        "StartActivity:call_adapter",
        "RunActivity:call_adapter",
    ):
        assert expected in names, (expected, names)
    # Connected: every span but the root has its parent in the trace.
    ids = {s["span_id"] for s in trace}
    orphans = [s["name"] for s in trace if s is not root and s["parent_id"] not in ids]
    assert not orphans, orphans
    (attempt,) = [s for s in trace if s["name"] == "RunActivity:call_adapter"]
    assert attempt["attributes"]["promptjobs.job_id"] == accepted["job_id"]
    assert attempt["attributes"]["promptjobs.org"] == "acme"
    assert attempt["attributes"]["promptjobs.attempt"] == 1
    # The provider call under the attempt, and its HTTP request (where the SDK's transport
    # is httpx; the OpenAI SDK's is not) under that.
    (call,) = [s for s in trace if s["name"] == "provider openai"]
    assert call["parent_id"] == attempt["span_id"]
    assert call["attributes"]["promptjobs.outcome"] == "ok"
    assert call["attributes"]["promptjobs.attempt"] == 1


async def test_an_api_key_in_the_url_never_reaches_a_span(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}")
    memory = InMemorySpanExporter()
    tracing = start_tracing(settings, "api", exporter=memory, install_globally=False)
    assert tracing is not None
    async with running_stack(
        settings, dev_server.client, run_worker=False, tracing=tracing
    ) as stack:
        # The web page's EventSource cannot set headers: it sends the key in the URL.
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as anonymous:
            async with anonymous.stream(
                "GET", "/v1/events", params={"access_token": stack.api_key, "since": "0"}
            ) as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith(":"):
                        break
    tracing.shutdown()

    spans = memory.get_finished_spans()
    events = [s for s in spans if s.name.startswith("GET /v1/events")]
    assert events, [s.name for s in spans]
    values = [str(v) for s in spans for v in (s.attributes or {}).values()]
    assert not [v for v in values if stack.api_key in v]
    assert any("access_token=REDACTED" in v for v in values), values


def test_secrets_in_a_query_are_redacted_and_nothing_else() -> None:
    assert (
        redact_secrets("/v1/events?since=0&access_token=pj_1_abc&job_id=job_1")
        == "/v1/events?since=0&access_token=REDACTED&job_id=job_1"
    )
    assert (
        redact_secrets("https://x.test/v1?key=AIza&alt=sse")
        == "https://x.test/v1?key=REDACTED&alt=sse"
    )
    assert redact_secrets("/v1/jobs?since=0&monkey=1") == "/v1/jobs?since=0&monkey=1"
