"""Traces (OpenTelemetry): off unless OTEL_* settings name an exporter; then one trace covers a
submission from POST /v1/prompts through the workflow start, the workflow, each attempt's
activity and the provider's HTTP call (the context rides in Temporal headers).

Nothing here is imported, and no interceptor or middleware installed, while tracing is off:
the hot paths run exactly as without it. The few `trace.get_current_span()` calls in the code
that add job attributes then hit OpenTelemetry's no-op span.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from promptjobs.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from starlette.applications import Starlette
    from temporalio.client import Interceptor

Role = Literal["api", "worker", "dev"]

# A secret's value in a URL's query: our `access_token` (the page's EventSource sends the API
# key so), and the names other APIs give a key in a URL (`key`, `api_key`, `token`…).
SECRET_IN_QUERY = re.compile(
    r"(?i)((?:^|[?&;])(?:access_token|api[-_]?key|key|token|secret|password)=)[^&;#\s]*"
)
REDACTED = "REDACTED"


def has_secret(value: str) -> bool:
    return SECRET_IN_QUERY.search(value) is not None


def redact_secrets(value: str) -> str:
    """`value` with each secret query parameter's value replaced by REDACTED."""
    return SECRET_IN_QUERY.sub(rf"\1{REDACTED}", value)


def redacting(exporter: SpanExporter) -> SpanExporter:
    """`exporter`, handed each span with its secret query parameters redacted from every
    string attribute. At export, not at a span's start: the ASGI instrumentation sets
    `http.url`, `http.target` and `url.query` (API key and all) again after the start."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    def clean(span: ReadableSpan) -> ReadableSpan:
        attributes = dict(span.attributes or {})
        secret = [k for k, v in attributes.items() if isinstance(v, str) and has_secret(v)]
        if not secret:
            return span
        for name in secret:
            attributes[name] = redact_secrets(str(attributes[name]))
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=attributes,
            events=span.events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    class Redacting(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return exporter.export([clean(span) for span in spans])

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return exporter.force_flush(timeout_millis)

    return Redacting()


@dataclass
class Tracing:
    provider: TracerProvider

    def interceptors(self) -> list[Interceptor]:
        """For the Temporal client: traces its starts, and (passed on to the worker built on
        that client) its workflows and activities."""
        from temporalio.contrib.opentelemetry import TracingInterceptor

        return [TracingInterceptor(self.provider.get_tracer("promptjobs"))]

    def instrument_app(self, app: Starlette) -> None:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        # The probes and scrapes would drown the traces that matter.
        FastAPIInstrumentor.instrument_app(
            app,  # type: ignore[arg-type]
            tracer_provider=self.provider,
            excluded_urls="healthz,readyz,metrics",
        )

    def shutdown(self) -> None:
        """Export what is buffered, then stop."""
        self.provider.shutdown()


def start_tracing(
    settings: Settings,
    role: Role,
    *,
    exporter: SpanExporter | None = None,
    install_globally: bool = True,
) -> Tracing | None:
    """A tracer provider for this process, or None when tracing is off. `exporter` replaces
    the configured one (tests); `install_globally` makes it the process's provider and traces
    outgoing httpx calls (the provider SDKs' transport) — what a real process wants, and a
    test process does not."""
    kind = settings.tracing_exporter
    if exporter is None and kind is None:
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if exporter is None:
        if kind == "console":
            exporter = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=settings.otlp_traces_url)
    name = settings.otel_service_name or f"promptjobs-{role}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(redacting(exporter)))
    if install_globally:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        trace.set_tracer_provider(provider)
        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    return Tracing(provider)
