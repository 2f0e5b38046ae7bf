"""OpenAI's Batch API on the wire: the `batch` object, and the lines of its files (a request
line in, as a checked `Submission`; an output or error line out). The loop that moves a
batch on is services/openai_batches.py's `BatchRunner`."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from activities.adapters.base import InvalidOptions
from activities.adapters.conversation import ImagesTooLarge, InvalidConversation
from api.openai.chat import ChatRequest, chat_completion
from api.openai.errors import error_type, param_of
from api.openai.responses import (
    CreateResponse,
    UnsupportedParameter,
    answered_object,
    submission_of,
)
from projections.domain.errors import PromptTooLarge
from projections.domain.lifecycle import ErrorKind, JobState
from projections.models import Batch
from projections.openai_batches import Line, Outcome, timestamp
from projections.writes import Submission
from services.jobs import JobService
from services.openai_batches import LineError

ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
WINDOWS = {"24h": timedelta(hours=24)}
# Bytes of a line: far more than a prompt of PROMPTJOBS_MAX_PROMPT_BYTES needs as JSON.
LINE_OVERHEAD = 64 * 1024


def batch_object(batch: Batch, counts: dict[JobState, int] | None = None) -> dict[str, Any]:
    """The `batch` object; `counts` (while it runs) are its jobs' states now."""
    if counts is None:
        completed, failed = batch.completed, batch.failed
    else:
        completed = counts.get(JobState.SUCCEEDED, 0)
        failed = counts.get(JobState.FAILED, 0) + counts.get(JobState.CANCELLED, 0)
    return {
        "id": batch.batch_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": timestamp(batch.created_at),
        "in_progress_at": timestamp(batch.in_progress_at),
        "expires_at": timestamp(batch.expires_at),
        "finalizing_at": timestamp(batch.finalizing_at),
        "completed_at": timestamp(batch.completed_at),
        "failed_at": timestamp(batch.failed_at),
        "expired_at": timestamp(batch.expired_at),
        "cancelling_at": timestamp(batch.cancelling_at),
        "cancelled_at": timestamp(batch.cancelled_at),
        "request_counts": {"total": batch.total, "completed": completed, "failed": failed},
        "metadata": batch.meta or {},
    }


class OpenAIBatchLines:
    """OpenAI's batch lines (services/openai_batches.py `BatchWire`): its request lines in,
    its output and error lines out."""

    def __init__(self, jobs: JobService, *, max_prompt_bytes: int) -> None:
        self.jobs = jobs
        self.max_prompt_bytes = max_prompt_bytes

    @property
    def max_line_bytes(self) -> int:
        return self.max_prompt_bytes * 6 + LINE_OVERHEAD

    def parse(self, raw: bytes | None, number: int, endpoint: str, seen: set[str]) -> Line:
        """Line `number` (from 0) of an input file as a Line, or a LineError as OpenAI says
        it (`seen`: the custom_ids before it; `raw` None: a line too long to read)."""
        if raw is None:
            raise LineError(
                "line_too_large",
                f"This line is over {self.max_line_bytes:,} bytes, more than the largest "
                "prompt needs.",
            )
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise LineError(
                "invalid_json_line", "This line is not parseable as valid JSON."
            ) from None
        if not isinstance(value, dict):
            raise LineError("invalid_request", "Each line must be a JSON object.")
        custom_id = value.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
            raise LineError(
                "missing_required_parameter",
                "custom_id must be a string of 1 to 512 characters.",
                "custom_id",
            )
        if custom_id in seen:
            raise LineError(
                "duplicate_custom_id",
                f"The custom_id {custom_id!r} is used by more than one line.",
                "custom_id",
            )
        if value.get("method") != "POST":
            raise LineError("invalid_method", "method must be POST.", "method")
        if value.get("url") != endpoint:
            raise LineError(
                "mismatched_endpoint",
                f"url must be the batch's endpoint, {endpoint}.",
                "url",
            )
        body = value.get("body")
        if not isinstance(body, dict):
            raise LineError("invalid_request", "body must be a JSON object.", "body")
        return Line(number, custom_id, self._submission(body, endpoint))

    def _submission(self, body: dict[str, Any], endpoint: str) -> Submission:
        try:
            if endpoint == "/v1/chat/completions":
                chat = ChatRequest.model_validate(body)
                submission = chat.submission(self.jobs.adapters, in_batch=True)
            else:
                request = CreateResponse.model_validate(body)
                if request.previous_response_id is not None:
                    raise UnsupportedParameter(
                        "previous_response_id",
                        "a batch line cannot continue a response: send the conversation in `input`",
                    )
                if request.background or request.stream:
                    raise UnsupportedParameter(
                        "background" if request.background else "stream",
                        "a batch line is neither background nor streamed: leave it out",
                    )
                submission = submission_of(request, self.jobs.adapters, in_batch=True)
            return self.jobs.check(submission).submission
        except ValidationError as err:
            first = err.errors()[0]
            param = param_of(("body", *first["loc"]))
            raise LineError("invalid_request", f"body.{param}: {first['msg']}", param) from err
        except UnsupportedParameter as err:
            raise LineError(err.code, err.message, err.param) from err
        except InvalidOptions as err:
            raise LineError("invalid_request", str(err), "promptjobs.options") from err
        except PromptTooLarge as err:
            raise LineError(err.code, err.worded("the input", "instructions"), "input") from err
        except (InvalidConversation, ImagesTooLarge) as err:
            where = "messages" if endpoint == "/v1/chat/completions" else "input"
            raise LineError("invalid_request", str(err), where) from err

    def output_line(self, batch: Batch, outcome: Outcome) -> dict[str, Any]:
        return output_line(batch, outcome)

    def error_line(self, batch: Batch, outcome: Outcome) -> dict[str, Any]:
        return error_line(batch, outcome)


def output_line(batch: Batch, outcome: Outcome) -> dict[str, Any]:
    assert outcome.response is not None
    if batch.endpoint == "/v1/chat/completions":
        body = chat_completion(outcome.prompt, outcome.job, outcome.response)
    else:
        body = answered_object(outcome.prompt, outcome.job, outcome.response)
    return {
        "id": "batch_req_" + outcome.job.job_id.removeprefix("job_"),
        "custom_id": outcome.custom_id,
        "response": {"status_code": 200, "request_id": outcome.job.job_id, "body": body},
        "error": None,
    }


# The HTTP status a line's failure is reported with, by error kind.
STATUS_OF_KIND: dict[ErrorKind, int] = {
    ErrorKind.PROVIDER_4XX: 400,
    ErrorKind.PARSE: 502,
    ErrorKind.SCHEMA_MISMATCH: 502,
    ErrorKind.AUTH: 401,
    ErrorKind.RATE_LIMIT: 429,
    ErrorKind.TIMEOUT: 504,
}


def error_line(batch: Batch, outcome: Outcome) -> dict[str, Any]:
    job = outcome.job
    line_id = "batch_req_" + job.job_id.removeprefix("job_")
    if job.state != JobState.FAILED:
        code = "batch_expired" if batch.expired_at is not None else "batch_cancelled"
        message = (
            "This request could not be executed before the completion window expired."
            if code == "batch_expired"
            else "This request was not executed because the batch was cancelled."
        )
        return {
            "id": line_id,
            "custom_id": outcome.custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    kind = job.error_kind or ErrorKind.UNKNOWN
    status = STATUS_OF_KIND.get(kind, 500)
    error = {
        "message": f"{kind.value}: {job.error_message or 'the job failed'}",
        "type": error_type(status),
        "param": None,
        "code": kind.value,
    }
    return {
        "id": line_id,
        "custom_id": outcome.custom_id,
        "response": {"status_code": status, "request_id": job.job_id, "body": {"error": error}},
        "error": None,
    }
