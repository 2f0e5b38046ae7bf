"""Traces (OpenTelemetry): off unless OTEL_* settings name an exporter; then one trace covers a
submission from POST /v1/prompts through the workflow start, the workflow, each attempt's
activity and the provider's HTTP call (the context rides in Temporal headers).

Nothing here is imported, and no interceptor or middleware installed, while tracing is off:
the hot paths run exactly as without it. The few `trace.get_current_span()` calls in the code
that add job attributes then hit OpenTelemetry's no-op span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from promptjobs.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from starlette.applications import Starlette
    from temporalio.client import Interceptor

Role = Literal["api", "worker", "dev"]


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
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if install_globally:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        trace.set_tracer_provider(provider)
        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    return Tracing(provider)
