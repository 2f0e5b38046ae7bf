"""Errors as RFC 9457 problem details: one machine-readable shape for every failure."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("promptjobs.api")

PROBLEM_JSON = "application/problem+json"


class FieldError(BaseModel):
    field: str = Field(description="Where in the request, e.g. body.priority or query.limit")
    message: str


class ProblemDetails(BaseModel):
    type: str = Field(description="A URI naming the kind of problem; stable, machine-readable")
    title: str
    status: int
    detail: str = Field(description="What went wrong and what to change")
    code: str = Field(description="The problem's short machine-readable name")
    errors: list[FieldError] = Field(default_factory=list)
    job_id: str | None = None
    state: str | None = None


class Problem(Exception):
    """Raised anywhere in the API; rendered as problem details with its status."""

    def __init__(
        self,
        status: int,
        code: str,
        title: str,
        detail: str,
        *,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.body = ProblemDetails(
            type=f"/problems/{code}",
            title=title,
            status=status,
            detail=detail,
            code=code,
            errors=errors or [],
            **extra,
        )
        self.headers = headers


def not_found(what: str, ident: str) -> Problem:
    return Problem(404, "not_found", "Not found", f"no {what} {ident!r} in your organisation")


def problem_response(problem: Problem) -> JSONResponse:
    return JSONResponse(
        problem.body.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=problem.headers,
    )


def _location(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def install(app: FastAPI) -> None:
    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(
            Problem(500, "internal", "Internal error", "the server failed; nothing was lost, retry")
        )

    @app.exception_handler(Problem)
    async def _problem(_request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(field=_location(tuple(e["loc"])), message=e["msg"]) for e in exc.errors()
        ]
        summary = "; ".join(f"{e.field}: {e.message}" for e in errors[:5])
        return problem_response(
            Problem(
                422, "validation", "Invalid request", f"fix these fields: {summary}", errors=errors
            )
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return problem_response(
            Problem(
                exc.status_code,
                code,
                str(exc.detail),
                str(exc.detail),
                headers=dict(exc.headers or {}),
            )
        )
