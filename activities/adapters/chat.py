"""What the HTTP chat adapters share: their job options, the HTTP status table, Retry-After
hints, the call deadline and the reading of a streamed answer."""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, SecretStr, ValidationError

from activities.adapters.base import InvalidOptions, StreamedOutput
from activities.adapters.options import PromptOptions
from activities.errors import AdapterError
from projections.domain.lifecycle import AttemptResult, ErrorKind, Reason

A = TypeVar("A", bound=BaseModel)

# Longest provider message we keep in a job's error_message.
DETAIL_LIMIT = 500


class ChatAdapter:
    """What the chat adapters share: where the provider is, the default model, the strict
    reading of a job's options, and the credential, checked at submission and at call."""

    name: str
    # The variable that sets the API key, named in the refusal when it is missing.
    credential: str
    default_base_url: str
    # Its answers carry the provider's rate limits (projections/budgets.py learns them).
    says_limits = True

    def __init__(
        self, *, api_key: SecretStr | None, base_url: str | None, timeout_s: float, model: str
    ) -> None:
        self.api_key = api_key
        self.base_url = base_url or self.default_base_url
        self.timeout_s = timeout_s
        self.model = model

    @property
    def configured(self) -> bool:
        return self.api_key is not None

    def check(self, options: PromptOptions) -> None:
        if options.fake is not None:
            raise InvalidOptions(
                'options.fake: only the fake provider takes it: remove it or use "provider": "fake"'
            )
        self.refuse(options)
        if self.api_key is None:
            raise InvalidOptions(self._missing_credential())

    def refuse(self, options: PromptOptions) -> None:
        """Raise InvalidOptions for what this provider's API refuses of valid options."""

    def secret(self) -> str:
        """The API key for a call. Without one the call is `auth`, which is not retried."""
        if self.api_key is None:
            raise AdapterError(ErrorKind.AUTH, self._missing_credential())
        return self.api_key.get_secret_value()

    def _missing_credential(self) -> str:
        return (
            f"provider {self.name!r} has no API key: set {self.credential} "
            "(any value for a server that checks none)"
        )


def status_kind(status: int) -> ErrorKind:
    """The error-kind table (docs/providers.md): which error kind an HTTP failure status is."""
    if status == 429:
        return ErrorKind.RATE_LIMIT
    if status in (401, 403):
        return ErrorKind.AUTH
    if status == 408:
        # Request Timeout: the provider gave up waiting, as a client timeout would.
        return ErrorKind.TIMEOUT
    if 500 <= status <= 599:
        return ErrorKind.PROVIDER_5XX
    if 400 <= status <= 499:
        return ErrorKind.PROVIDER_4XX
    return ErrorKind.UNKNOWN


def retry_after_s(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The provider's wait: `retry-after-ms`, else `Retry-After` in seconds or as an HTTP date.
    None when absent or unreadable, so the policy's own default applies."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def status_failure(
    provider: str,
    status: int,
    headers: Mapping[str, str],
    detail: str,
    request_id: str | None,
) -> AdapterError:
    kind = status_kind(status)
    where = f" (request {request_id})" if request_id else ""
    return AdapterError(
        kind,
        f"{provider}: HTTP {status}: {detail[:DETAIL_LIMIT]}{where}",
        retry_after_s=retry_after_s(headers) if kind is ErrorKind.RATE_LIMIT else None,
        reason=client_reason(status, detail),
    )


# How OpenAI-compatible servers and Anthropic word a request over the model's window
# (OpenAI: "This model's maximum context length is …", code context_length_exceeded;
# Anthropic: "prompt is too long: … tokens > … maximum"; vLLM and others: "… context length").
CONTEXT_WORDS = (
    "context length",
    "context_length",
    "context window",
    "prompt is too long",
    "input is too long",
    "too many tokens",
)


def client_reason(status: int, detail: str) -> Reason | None:
    """What a client error says that another place may not say: the model is gone (a 404
    naming the model: OpenAI's "The model `x` does not exist", Anthropic's "model: x"), or
    the request is over the model's context window (a 400 or 413 saying so)."""
    text = detail.lower()
    if status in (400, 413) and any(words in text for words in CONTEXT_WORDS):
        return Reason.CONTEXT_LENGTH
    if status == 404 and "model" in text:
        return Reason.MODEL_GONE
    return None


def transport_failure(
    provider: str, err: Exception, kinds: Sequence[tuple[type[Exception], ErrorKind]]
) -> AdapterError:
    """A failure without an HTTP status, by the first entry of `kinds` it is an instance of."""
    kind = next((kind for kind_of, kind in kinds if isinstance(err, kind_of)), ErrorKind.UNKNOWN)
    cause = err.__cause__
    if cause is None:
        why = f"{type(err).__name__}: {err}"
    else:
        why = f"{err} ({type(cause).__name__}{f': {cause}' if str(cause) else ''})"
    return AdapterError(kind, f"{provider}: {why}")


def stream_failure(
    provider: str, status: int, name: str, detail: str, request_id: str | None
) -> AdapterError:
    """An error event in a stream the provider had accepted (200), as the error of the HTTP
    `status` the same error has before a stream starts; no Retry-After comes with it."""
    where = f" (request {request_id})" if request_id else ""
    return AdapterError(
        status_kind(status),
        f"{provider}: {name} in the stream: {detail[:DETAIL_LIMIT]}{where}",
    )


@asynccontextmanager
async def deadline(provider: str, timeout_s: float) -> AsyncIterator[None]:
    """The whole call's limit. The SDK's timeout bounds each read, not a slow trickle; and a
    call that outlived the activity's own limit would look like a lost worker, not a timeout."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as err:
        raise AdapterError(
            ErrorKind.TIMEOUT, f"{provider}: no answer within {timeout_s:g} s"
        ) from err


@asynccontextmanager
async def streamed_call(provider: str, timeout_s: float) -> AsyncIterator[None]:
    """A streamed call: its deadline, and an event whose data is not JSON (the SDKs decode
    each event's data and let json's error through) as `parse`."""
    async with deadline(provider, timeout_s):
        try:
            yield
        except json.JSONDecodeError as err:
            raise AdapterError(
                ErrorKind.PARSE,
                f"{provider}: a stream event is not JSON ({err.msg}); it starts {err.doc[:120]!r}",
            ) from err
        except UnicodeDecodeError as err:
            raise AdapterError(ErrorKind.PARSE, f"{provider}: the stream is not UTF-8") from err


def event_stream(provider: str, headers: Mapping[str, str]) -> None:
    """Refuse an answer that is not Server-Sent Events (a proxy's page, a server that ignored
    `stream`) as `parse`: read as events it would look like an empty, cut stream."""
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "text/event-stream":
        raise AdapterError(
            ErrorKind.PARSE,
            f"{provider}: the answer is not an event stream (content-type {media or 'none'})",
        )


def read_event(provider: str, shape: type[A], data: object, what: str) -> A:
    """Validate the fields we read from one event. The SDKs are handed `object` as the event
    type, so they decode the JSON and leave its shape to us: a broken event is `parse` here,
    not an AttributeError far from its cause."""
    try:
        return shape.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "event"
        raise AdapterError(
            ErrorKind.PARSE,
            f"{provider}: a stream event is not a {what} ({where}: {first['msg']}); "
            f"it starts {json.dumps(data)[:120]!r}",
        ) from err


@dataclass
class StreamedAnswer:
    """What a stream has told besides its text (that goes to the StreamedOutput)."""

    model: str | None = None
    answer_id: str | None = None
    finish_reason: str | None = None
    # Its last event came: a stream that ends without it was cut.
    finished: bool = False

    def check_finished(self, provider: str, last: str, output: StreamedOutput) -> None:
        """A stream that ended cleanly but early (a proxy's timeout, a server that stopped) is
        the provider's failure, retried as a 5xx; what came stays in `output`."""
        if not self.finished:
            raise AdapterError(
                ErrorKind.PROVIDER_5XX,
                f"{provider}: the stream ended before its {last} "
                f"({output.deltas} text deltas received)",
            )


def chat_result(
    *,
    provider: str,
    output: StreamedOutput,
    answer: StreamedAnswer,
    model: str,
    request_id: str | None,
    started: float,
) -> AttemptResult:
    """The result as the responses table holds it (its column widths). `model` is the one
    asked for, kept when the stream names none."""
    request_id = request_id or answer.answer_id
    return AttemptResult(
        text=output.text,
        provider=provider,
        model=(answer.model or model)[:128],
        provider_request_id=request_id[:255] if request_id else None,
        finish_reason=answer.finish_reason[:64] if answer.finish_reason else None,
        input_tokens=output.input_tokens,
        output_tokens=output.output_tokens,
        latency_ms=round((time.monotonic() - started) * 1000),
        tool_calls=output.tool_calls,
    )
