"""Errors on the OpenAI-compatible routes in OpenAI's shape, `{"error": {"message", "type",
"param", "code"}}`, so its SDK raises the exception class it would against OpenAI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

# The routes that answer as OpenAI does: creating a response, one named by a `resp_` id, files
# and batches. Any other id under /v1/responses (`rsp_…`, promptjobs' own answers) is not.
RESPONSES = "/v1/responses"
OPENAI_PREFIXES = (
    f"{RESPONSES}/resp_",
    "/v1/files",
    "/v1/batches",
    "/v1/chat/completions",
    "/v1/models",
)


def speaks_openai(path: str) -> bool:
    return path == RESPONSES or path.startswith(OPENAI_PREFIXES)


def from_openai_sdk(headers: Mapping[str, str]) -> bool:
    """Whether the request comes from OpenAI's SDK (or another Stainless-made one, which reads
    errors the same way): it names its language in `X-Stainless-Lang`."""
    return "x-stainless-lang" in headers


def unknown_route(
    method: str, path: str, status: int, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A route or method promptjobs does not have, as OpenAI answers one, so the SDK shows
    what is there instead of a bare 404."""
    message = (
        f"Unknown request URL: {method} {path}. promptjobs answers OpenAI's "
        "/v1/chat/completions, /v1/responses, /v1/models, /v1/files and /v1/batches (see "
        "docs/openai.md), and its own /v1/prompts and /v1/jobs."
    )
    if status == 405:
        message = f"{method} is not allowed on {path}; see the Allow header."
    code = "unknown_url" if status == 404 else "method_not_allowed"
    return openai_error(status, message, code=code, headers=headers)


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def openai_error(
    status: int,
    message: str,
    *,
    code: str | None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """OpenAI answers a request it cannot take with 400 where promptjobs says 422."""
    status = 400 if status == 422 else status
    answer_headers = dict(headers or {})
    if status == 409:
        # The SDK retries a 409 unless told not to; a conflict does not go away by itself.
        answer_headers["x-should-retry"] = "false"
    # OpenAI's own type for a spent quota, which its SDK users match on.
    kind = code if code == "insufficient_quota" else error_type(status)
    body = {"message": message, "type": kind, "param": param, "code": code}
    return JSONResponse({"error": body}, status_code=status, headers=answer_headers)


# pydantic's error types as OpenAI's codes.
VALIDATION_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    "json_invalid": "invalid_json",
}


UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})


def param_of(loc: Sequence[Any]) -> str | None:
    """`("body", "input", 0, "role")` as OpenAI names a parameter: `input[0].role`."""
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path") else list(loc)
    name = ""
    for part in parts:
        if isinstance(part, str) and ("[" in part or part in UNION_TAGS):
            continue  # which member of a union pydantic tried, not a parameter
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or None


def validation_error(
    errors: Sequence[Mapping[str, Any]], message_of: Any, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The first of a request's field errors, as OpenAI reports one (`message_of`: the
    message promptjobs gives for a pydantic error)."""
    first = errors[0]
    param = param_of(tuple(first["loc"]))
    message = str(message_of(first))
    if param and first["type"] != "json_invalid":
        message = f"{param}: {message}"
    code = VALIDATION_CODES.get(str(first["type"]), "invalid_value")
    return openai_error(400, message, code=code, param=param, headers=headers)
