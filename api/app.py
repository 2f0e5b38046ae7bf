"""The FastAPI application: routes, problem handlers and the services they share."""

from __future__ import annotations

from fastapi import FastAPI

from api import problems
from api.deps import Services
from api.routes import events, health, jobs, metrics, page, prompts, responses


def create_app(services: Services) -> FastAPI:
    app = FastAPI(
        title="promptjobs",
        version="0.1.0",
        description=(
            "Durable LLM prompt jobs. Submit a prompt, get `202` and a job id at once, then "
            "follow the job by polling `GET /v1/jobs/{id}` or over Server-Sent Events."
        ),
    )
    app.state.services = services
    problems.install(app)
    for module in (prompts, jobs, responses, events, health, metrics, page):
        app.include_router(module.router)
    return app
