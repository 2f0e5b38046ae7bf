"""The FastAPI application: routes, problem handlers and the context they share."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from api import problems
from api.deps import ApiContext
from api.limits import BodyLimit
from api.openapi import exact_openapi
from api.routes import (
    batches,
    chat,
    events,
    files,
    health,
    jobs,
    metrics,
    page,
    prompts,
    responses,
    usage,
    webhooks,
)

# Room for the JSON envelope around the largest prompt allowed (options, escapes).
BODY_OVERHEAD_BYTES = 64 * 1024


def create_app(ctx: ApiContext) -> FastAPI:
    # /docs (Swagger UI) and /redoc with their scripts and styles served from the package
    # (fastapi-offline ships them), not a CDN: the docs work on a machine with no internet.
    app = FastAPIOffline(
        static_url="/docs-assets",
        title="promptjobs",
        version="0.1.0",
        description=(
            "Durable LLM prompt jobs. Submit a prompt, get `202` and a job id at once, then "
            "follow the job by polling `GET /v1/jobs` or over Server-Sent Events "
            "(`GET /v1/events`). Every error is `application/problem+json` (RFC 9457)."
        ),
    )
    # JSON escapes can make a prompt's body several times its UTF-8 size.
    app.add_middleware(
        BodyLimit,
        max_bytes=6 * ctx.max_prompt_bytes + ctx.max_image_bytes + BODY_OVERHEAD_BYTES,
        prompt_bytes=ctx.max_prompt_bytes,
        file_bytes=ctx.max_file_bytes,
    )
    app.state.context = ctx
    problems.install(app)
    for module in (
        prompts,
        jobs,
        responses,
        chat,
        files,
        batches,
        events,
        usage,
        webhooks,
        health,
        metrics,
        page,
    ):
        app.include_router(module.router)

    def openapi() -> dict[str, Any]:
        return exact_openapi(app, ctx.jobs.adapters.names(), ctx.jobs.adapters.routes)

    app.openapi = openapi  # type: ignore[method-assign]
    return app
