"""Errors as RFC 9457 problem details: one machine-readable shape for every failure."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from activities.adapters.base import InvalidOptions
from activities.adapters.conversation import ImagesTooLarge, InvalidConversation
from api.changes import StreamLimit
from api.openai.errors import (
    from_openai_sdk,
    openai_error,
    speaks_openai,
    unknown_route,
    validation_error,
)
from api.openai.responses import UnsupportedParameter
from api.schemas import REQUEST_FIELDS, unknown_field
from projections.budgets import OverBudget
from projections.domain.chains import UnknownPlaceholder
from projections.domain.errors import PromptTooLarge, Refused
from projections.errors import (
    IdempotencyConflict,
    InvalidState,
    NotFound,
    RetryLimit,
    database_unavailable,
)
from projections.files import FileTooLarge, OrgStorageFull
from projections.spend import CostsMoreThanCap, OverSpendCap, UnpricedUnderCap

log = logging.getLogger("promptjobs.api")

PROBLEM_JSON = "application/problem+json"


class FieldError(BaseModel):
    field: str = Field(description="Where in the request, e.g. body.priority or query.limit")
    message: str = Field(description="What is wrong with it and what to send instead")


class ProblemDetails(BaseModel):
    """RFC 9457 problem details, plus `code` and, for invalid requests, `errors` per field."""

    type: str = Field(description="A URI naming the kind of problem; stable, machine-readable")
    title: str = Field(description="A short summary of the kind of problem")
    status: int = Field(description="The HTTP status code")
    detail: str = Field(description="What went wrong and what to change")
    code: str = Field(description="The problem's short machine-readable name")
    instance: str | None = Field(default=None, description="The request path")
    errors: list[FieldError] = Field(default_factory=list)
    job_id: str | None = Field(default=None, description="The job, when a job is in the way")
    state: str | None = Field(default=None, description="Its state, when that is the problem")
    prompt_id: str | None = Field(default=None, description="The prompt, when it is in the way")
    limit: int | None = Field(default=None, description="The limit reached, for `retry_limit`")
    budget: str | None = Field(
        default=None, description="The provider budget, for `over_provider_budget`"
    )
    tokens: int | None = Field(
        default=None, description="The tokens the job needs at least, for `over_provider_budget`"
    )
    tokens_per_minute: int | None = Field(
        default=None, description="The budget's tokens a minute, for `over_provider_budget`"
    )
    usd_per_day: float | None = Field(
        default=None,
        description="The spend cap, for `insufficient_quota`, `over_spend_cap` and "
        "`unpriced_model`",
    )
    resets_at: datetime | None = Field(
        default=None, description="When the spend cap's day turns, for `insufficient_quota`"
    )


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


# The HTTP status and title of each refusal (the closest class in its MRO wins).
REFUSALS: dict[type[Refused], tuple[int, str]] = {
    NotFound: (404, "Not found"),
    InvalidState: (409, "Invalid state"),
    RetryLimit: (409, "Retry limit reached"),
    OverBudget: (422, "More than the provider budget allows"),
    OverSpendCap: (429, "Spend cap reached"),
    CostsMoreThanCap: (422, "More than the spend cap allows"),
    UnpricedUnderCap: (422, "Model has no price"),
    IdempotencyConflict: (422, "Idempotency-Key reused"),
    InvalidOptions: (422, "Invalid options"),
    InvalidConversation: (422, "Invalid conversation"),
    ImagesTooLarge: (422, "Images too large"),
    UnknownPlaceholder: (422, "Unknown placeholder"),
    PromptTooLarge: (413, "Prompt too large"),
    FileTooLarge: (413, "File too large"),
    OrgStorageFull: (413, "Storage quota exceeded"),
    StreamLimit: (429, "Too many event streams"),
    UnsupportedParameter: (400, "Unsupported parameter"),
}
# A 429 for too many streams: try again after this long (another stream may have ended).
STREAM_RETRY_AFTER_S = 5


def domain_problem(err: Refused, *, openai: bool = False) -> Problem:
    """The one mapping of the domain's refusals to problem details (`openai`: worded with
    the OpenAI routes' names for the prompt's fields)."""
    status, title = next(
        (REFUSALS[kind] for kind in type(err).__mro__ if kind in REFUSALS), (422, "Refused")
    )
    detail, extra, field = str(err), dict[str, Any](), None
    if isinstance(err, NotFound):
        return not_found(err.what, err.ident)
    if isinstance(err, InvalidState):
        title = f"Cannot {err.action} a {err.state.value} job"
        extra = {"job_id": err.job_id, "state": err.state.value}
    elif isinstance(err, RetryLimit):
        extra = {"job_id": err.job_id, "prompt_id": err.prompt_id, "limit": err.limit}
    elif isinstance(err, OverBudget):
        extra = {"budget": err.budget, "tokens": err.tokens, "tokens_per_minute": err.tpm}
    elif isinstance(err, OverSpendCap):
        wait_s = max(1, math.ceil((err.resets - datetime.now(UTC)).total_seconds()))
        # OpenAI's SDK retries a 429 unless told not to: this one lasts until the day turns.
        headers = {"Retry-After": str(wait_s), "x-should-retry": "false"}
        extra = {"usd_per_day": err.cap.usd_per_day, "resets_at": err.resets, "headers": headers}
    elif isinstance(err, CostsMoreThanCap | UnpricedUnderCap):
        extra = {"usd_per_day": err.cap.usd_per_day}
    elif isinstance(err, InvalidOptions):
        field = "body.options"
    elif isinstance(err, InvalidConversation | ImagesTooLarge):
        field = "body.messages"
    elif isinstance(err, UnknownPlaceholder):
        detail = f"the prompt's {err.placeholder} cannot be filled: {err.reason}"
    elif isinstance(err, PromptTooLarge):
        names = ("the input", "instructions") if openai else ("the prompt", "options.system")
        detail, field = err.worded(*names), "body.input" if openai else "body.prompt"
    elif isinstance(err, FileTooLarge):
        detail = f"the file is over {err.limit:,} bytes (PROMPTJOBS_MAX_FILE_BYTES)"
        field = "body.file"
    elif isinstance(err, OrgStorageFull):
        detail = (
            f"your organisation's files take {err.used:,} of the {err.quota:,} bytes they may "
            "(PROMPTJOBS_ORG_MAX_FILE_BYTES): delete files you no longer need"
        )
        field = "body.file"
    elif isinstance(err, StreamLimit):
        extra = {"headers": {"Retry-After": str(STREAM_RETRY_AFTER_S)}}
    elif isinstance(err, UnsupportedParameter):
        field = f"body.{err.param}"
    errors = [FieldError(field=field, message=detail)] if field else None
    return Problem(status, err.code, title, detail, errors=errors, **extra)


# How long a client is asked to wait while the projection database is unreachable: outages
# this service rides out (a failover, a restart) last seconds.
UNAVAILABLE_RETRY_AFTER_S = 2


def unavailable_problem() -> Problem:
    return Problem(
        503,
        "unavailable",
        "Temporarily unavailable",
        "the job database cannot be reached right now; nothing you sent before was lost. "
        f"Retry in {UNAVAILABLE_RETRY_AFTER_S} s (with the same Idempotency-Key, if you sent "
        "one)",
        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
    )


def problem_response(problem: Problem, request: Request | None = None) -> JSONResponse:
    body = problem.body
    if request is not None and speaks_openai(request.url.path):
        field = body.errors[0].field if body.errors else None
        return openai_error(
            problem.status,
            body.detail,
            code=body.code,
            param=field.split(".", 1)[-1] if field else None,
            headers=problem.headers,
        )
    if request is not None and body.instance is None:
        body = body.model_copy(update={"instance": request.url.path})
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=problem.headers,
    )


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: each status it can answer with a problem (and 500)."""
    return {status: {"model": ProblemDetails} for status in (*statuses, 500)}


# Messages clients can act on, where pydantic's own would only describe the failure.
CURSOR_FIELDS = {"since", "last-event-id"}
CURSOR_HINT = (
    "not a cursor: send a `next_cursor` or SSE event id you were given (digits), or 0 to start "
    "from the beginning"
)


def _location(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc)


def field_message(error: Mapping[str, Any], known: Iterable[str] = ()) -> str:
    """A pydantic error as a client can act on it (`known`: the field names a misspelt one
    may have meant)."""
    if error["type"] == "extra_forbidden":
        return unknown_field(str(tuple(error["loc"])[-1]), known)
    return _message(error)


def _message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    loc = tuple(error["loc"])
    if kind == "json_invalid":
        reason = error.get("ctx", {}).get("error", "malformed")
        return f"the request body is not valid JSON ({reason} at character {loc[-1]})"
    if loc == ("body",) and kind == "missing":
        return 'the request body is empty: send a JSON object such as {"prompt": "Hello"}'
    if loc == ("body",) and kind in ("model_type", "model_attributes_type", "dict_type"):
        return 'the request body must be a JSON object such as {"prompt": "Hello"}'
    if kind == "extra_forbidden":
        return "unknown field: remove it (see the OpenAPI document for the fields allowed)"
    if kind == "string_pattern_mismatch" and str(loc[-1]).lower() in CURSOR_FIELDS:
        return CURSOR_HINT
    if kind == "string_pattern_mismatch" and "\\x00" in str(error.get("ctx", {}).get("pattern")):
        return "must not contain NUL (\\u0000) characters"
    return str(error["msg"])


def validation_problem(errors: Sequence[Mapping[str, Any]], known: Iterable[str] = ()) -> Problem:
    fields = [
        FieldError(field=_location(e["loc"]), message=field_message(e, known)) for e in errors
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        return Problem(
            422, "invalid_json", "Body is not valid JSON", fields[0].message, errors=fields
        )
    summary = "; ".join(f"{e.field}: {e.message}" for e in fields[:5])
    return Problem(
        422, "validation", "Invalid request", f"fix these fields: {summary}", errors=fields
    )


# FastAPI's answer when the body cannot even be decoded as text (JSON errors have their own).
FASTAPI_BODY_UNREADABLE = "There was an error parsing the body"
NOT_UTF8 = {"type": "json_invalid", "loc": ("body", 0), "ctx": {"error": "not UTF-8 text"}}
TOO_DEEP = {
    "type": "json_invalid",
    "loc": ("body", 0),
    "ctx": {"error": "nested too deeply (arrays and objects within each other)"},
}


def unreadable_body(cause: BaseException | None) -> dict[str, Any]:
    """Why FastAPI could not read the body: the JSON parser's recursion limit, else the text."""
    return TOO_DEEP if isinstance(cause, RecursionError) else NOT_UTF8


HTTP_CODES = {
    404: ("not_found", "no such route; see /docs for the API"),
    405: ("method_not_allowed", "this route does not take that method; see the Allow header"),
    413: ("body_too_large", "the request body is larger than this server accepts"),
}


def _http_detail(exc: StarletteHTTPException) -> tuple[str, str]:
    code, default = HTTP_CODES.get(exc.status_code, ("http_error", str(exc.detail)))
    # Starlette's own details are bare reason phrases; ours say what to do.
    generic = str(exc.detail) in ("", HTTPStatus(exc.status_code).phrase)
    return code, default if generic else str(exc.detail)


def install(app: FastAPI) -> None:
    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(
            Problem(
                500, "internal", "Internal error", "the server failed; nothing was lost, retry"
            ),
            request,
        )

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, exc: DBAPIError) -> JSONResponse:
        if not database_unavailable(exc):
            return await _internal(request, exc)
        log.warning("projection database unavailable: %s", exc.__class__.__name__)
        return problem_response(unavailable_problem(), request)

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc, request)

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> JSONResponse:
        openai = speaks_openai(request.url.path)
        return problem_response(domain_problem(exc, openai=openai), request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if speaks_openai(request.url.path):
            return validation_error(exc.errors(), lambda e: field_message(e, REQUEST_FIELDS))
        return problem_response(validation_problem(exc.errors(), REQUEST_FIELDS), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == FASTAPI_BODY_UNREADABLE:
            return problem_response(validation_problem([unreadable_body(exc.__cause__)]), request)
        unknown = exc.status_code in (404, 405) and request.url.path.startswith("/v1/")
        if unknown and from_openai_sdk(request.headers):
            return unknown_route(
                request.method, request.url.path, exc.status_code, dict(exc.headers or {})
            )
        code, detail = _http_detail(exc)
        return problem_response(
            Problem(
                exc.status_code, code, str(exc.detail), detail, headers=dict(exc.headers or {})
            ),
            request,
        )
