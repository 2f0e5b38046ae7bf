"""The `openai` provider: chat completions on any OpenAI-compatible endpoint (OpenAI, vLLM,
Ollama, LiteLLM, OpenRouter…) streamed through the official SDK, with its failures classified."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

import openai
from pydantic import BaseModel, Field, SecretStr, ValidationError

from activities.adapters.base import AdapterRequest, StreamedOutput, answered_call
from activities.adapters.batch import (
    BATCH_TAG,
    CLOCK_SLACK,
    BatchStatus,
    BatchUnsupported,
    LineResult,
    ResultLine,
    read_result_line,
)
from activities.adapters.chat import (
    ChatAdapter,
    StreamedAnswer,
    chat_result,
    event_stream,
    read_event,
    status_failure,
    stream_failure,
    streamed_call,
    transport_failure,
)
from activities.adapters.conversation import Message
from activities.adapters.structured import OutputSchema
from activities.errors import AdapterError
from projections.domain.lifecycle import AttemptResult, ErrorKind

# The SDK's failures that carry no HTTP status, most specific first (a timeout is also a
# connection error).
TRANSPORT_KINDS: tuple[tuple[type[openai.OpenAIError], ErrorKind], ...] = (
    (openai.APITimeoutError, ErrorKind.TIMEOUT),
    (openai.APIConnectionError, ErrorKind.PROVIDER_5XX),
    (openai.APIResponseValidationError, ErrorKind.PARSE),
)


# An error event in a stream (`data: {"error": {...}}`), by its `code`, else its `type`: the
# HTTP status the same error has before a stream starts. What is not here is the server's
# failure (500): it had accepted the request.
STREAM_ERRORS: dict[str, int] = {
    "invalid_request_error": 400,
    "invalid_api_key": 401,
    # A 429 that waiting will not cure, as classify() treats it before a stream.
    "insufficient_quota": 402,
    "rate_limit_exceeded": 429,
    "server_error": 500,
}


def classify(
    err: openai.OpenAIError, provider: str = "openai", request_id: str | None = None
) -> AdapterError:
    """An SDK failure as an ErrorKind: by HTTP status when there is one, by the error event's
    code or type for a failure in the middle of a stream, else by type. `request_id`: the
    stream's, for an error that arrives in it."""
    if isinstance(err, openai.APIStatusError):
        body = err.body if isinstance(err.body, dict) else {}
        detail = str(body.get("message") or err.message)
        if err.status_code == 429 and err.code == "insufficient_quota":
            # A 429 that waiting will not cure: the account is out of credit.
            return AdapterError(
                ErrorKind.PROVIDER_4XX,
                f"{provider}: HTTP 429 insufficient_quota: {detail}",
            )
        headers = err.response.headers
        return status_failure(provider, err.status_code, headers, detail, err.request_id)
    if type(err) is openai.APIError:
        # The SDK raises the bare APIError for an `{"error": ...}` event in a stream.
        body = err.body if isinstance(err.body, dict) else {}
        code, kind = str(body.get("code") or ""), str(body.get("type") or "")
        status = STREAM_ERRORS.get(code) or STREAM_ERRORS.get(kind) or 500
        return stream_failure(provider, status, code or kind or "error", err.message, request_id)
    return transport_failure(provider, err, TRANSPORT_KINDS)


class _FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(BaseModel):
    index: int = 0
    id: str | None = None
    function: _FunctionDelta | None = None


class _Delta(BaseModel):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(BaseModel):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class ChatCompletionChunk(BaseModel):
    """The fields of a streamed chunk we read; compatible servers differ in the rest. The usage
    chunk has no choices."""

    id: str | None = None
    model: str | None = None
    choices: list[_Choice] = Field(default_factory=list)
    usage: _Usage | None = None


def read_chunk(chunk: ChatCompletionChunk, answer: StreamedAnswer, output: StreamedOutput) -> None:
    answer.model = chunk.model or answer.model
    answer.answer_id = answer.answer_id or chunk.id
    for choice in chunk.choices:
        # One completion is asked for (n=1): its choice is index 0.
        if choice.index != 0:
            continue
        if choice.delta is not None:
            output.delta(choice.delta.content or "")
            output.delta(choice.delta.refusal or "")
            for call in choice.delta.tool_calls or ():
                function = call.function or _FunctionDelta()
                output.tool_call(
                    call.index,
                    call_id=call.id,
                    name=function.name,
                    arguments=function.arguments or "",
                )
        if choice.finish_reason:
            answer.finish_reason = choice.finish_reason
            # The last choice chunk; the usage chunk may follow, but the answer is whole.
            answer.finished = True
    if chunk.usage is not None:
        output.usage(
            input_tokens=chunk.usage.prompt_tokens, output_tokens=chunk.usage.completion_tokens
        )


# What an assistant message may carry back from OpenAI's SDK that a request does not send.
ANSWER_ONLY = frozenset({"refusal", "annotations", "audio", "function_call"})


def chat_message(message: Message) -> dict[str, Any]:
    """A message of the conversation as Chat Completions takes it. A `developer` message goes
    as `system`, which every compatible server knows (OpenAI reads it as developer text for
    the models that have the role)."""
    sent = message.model_dump(mode="json", exclude_none=True, exclude=set(ANSWER_ONLY))
    if sent["role"] == "developer":
        sent["role"] = "system"
    return sent


class OpenAICompatAdapter(ChatAdapter):
    name = "openai"
    credential = "PROMPTJOBS_OPENAI_API_KEY"
    default_base_url = "https://api.openai.com/v1"

    def __init__(
        self,
        *,
        api_key: SecretStr | None,
        base_url: str | None,
        timeout_s: float,
        model: str,
        max_tokens: int | None,
        max_tokens_field: Literal["max_completion_tokens", "max_tokens"],
    ) -> None:
        super().__init__(api_key=api_key, base_url=base_url, timeout_s=timeout_s, model=model)
        self.max_tokens = max_tokens
        self.max_tokens_field = max_tokens_field

    @cached_property
    def client(self) -> openai.AsyncOpenAI:
        # Everything explicit, so the SDK reads no OPENAI_* variable behind Settings' back;
        # no SDK retries, since Temporal runs the attempts.
        return openai.AsyncOpenAI(
            api_key=self.secret(),
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=0,
        )

    def body(self, request: AdapterRequest) -> dict[str, Any]:
        """The chat completion request the job makes (without its streaming arguments): one
        call's, or one line's of a provider batch."""
        options = request.options
        messages: list[dict[str, Any]] = []
        if options.system:
            messages.append({"role": "system", "content": options.system})
        messages.extend(chat_message(message) for message in request.conversation)
        body: dict[str, Any] = {"model": options.model or self.model, "messages": messages}
        for name in ("temperature", "top_p", "seed", "stop", "parallel_tool_calls"):
            if (value := getattr(options, name)) is not None:
                body[name] = value
        if options.tools:
            body["tools"] = [
                tool.model_dump(mode="json", exclude_none=True) for tool in options.tools
            ]
        if isinstance(options.tool_choice, str):
            body["tool_choice"] = options.tool_choice
        elif options.tool_choice is not None:
            body["tool_choice"] = options.tool_choice.model_dump(mode="json")
        if options.output_schema is not None:
            body["response_format"] = response_format(options.output_schema)
        max_tokens = options.max_tokens or self.max_tokens
        if max_tokens is not None:
            body[self.max_tokens_field] = max_tokens
        return body

    def batches(self) -> OpenAIBatches:
        return OpenAIBatches(self)

    async def complete(self, request: AdapterRequest, output: StreamedOutput) -> AttemptResult:
        body = self.body(request)
        model = str(body["model"])
        client = self.client
        answer = StreamedAnswer()
        request_id: str | None = None
        started = output.call_begins()
        try:
            async with (
                streamed_call(self.name, self.timeout_s),
                # Leaving the block closes the response, and with it the connection, however
                # it is left: a failure, or the activity's cancellation.
                client.chat.completions.with_streaming_response.create(
                    **body, stream=True, stream_options={"include_usage": True}
                ) as raw,
            ):
                request_id = raw.headers.get("x-request-id")
                output.answered_with(raw.headers)
                event_stream(self.name, raw.headers)
                async for data in await raw.parse(to=openai.AsyncStream[object]):
                    chunk = read_event(
                        self.name, ChatCompletionChunk, data, "chat completion chunk"
                    )
                    read_chunk(chunk, answer, output)
        except openai.OpenAIError as err:
            if isinstance(err, openai.APIStatusError):
                output.answered_with(err.response.headers)
            raise classify(err, self.name, request_id) from err
        answer.check_finished(self.name, "last choice chunk (finish_reason)", output)
        return chat_result(
            provider=self.name,
            output=output,
            answer=answer,
            model=model,
            request_id=request_id,
            started=started,
        )


class _Function(BaseModel):
    name: str = ""
    arguments: str = ""


class _ToolCall(BaseModel):
    id: str = ""
    function: _Function = Field(default_factory=_Function)


class _Message(BaseModel):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _CompletionChoice(BaseModel):
    index: int = 0
    message: _Message = Field(default_factory=_Message)
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    """The fields of a whole (unstreamed) chat completion we read: a batch line's answer."""

    id: str | None = None
    model: str | None = None
    choices: list[_CompletionChoice] = Field(default_factory=list)
    usage: _Usage | None = None


# A provider batch's line ended without running, by its error's code: not a failure of it.
NOT_RUN = ("batch_expired", "batch_cancelled")
ENDED = ("completed", "expired", "cancelled", "failed")
ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
# A batch's input file is kept in memory up to this size while it is written, then on disk.
SPOOL_BYTES = 8 * 2**20


class OpenAIBatches:
    """OpenAI's Batch API (activities/adapters/batch.py): a JSONL file uploaded with
    purpose "batch", a batch of it tagged in its metadata, and its output and error files."""

    def __init__(self, adapter: OpenAICompatAdapter) -> None:
        self.adapter = adapter
        self.name = adapter.name

    def _failure(self, err: openai.OpenAIError) -> Exception:
        if isinstance(err, openai.APIStatusError) and err.status_code in (404, 405):
            return BatchUnsupported(
                f"{self.name} at {self.adapter.base_url} has no batch API "
                f"(HTTP {err.status_code} from {err.request.url.path})"
            )
        return classify(err, self.name)

    async def find(self, tag: str, since: datetime, lines: int) -> list[str]:
        # Newest first, page by page, back to the send's start: however many batches the
        # account made since, ours is found by its tag.
        oldest = (since - CLOCK_SLACK).timestamp()
        try:
            async for batch in self.adapter.client.batches.list(limit=100):
                if (batch.metadata or {}).get(BATCH_TAG) == tag:
                    return [batch.id]
                if batch.created_at < oldest:
                    break
        except openai.OpenAIError as err:
            raise self._failure(err) from err
        return []

    async def submit(self, tag: str, model: str, lines: AsyncIterable[AdapterRequest]) -> str:
        # The JSONL is written as the lines come, spilling to disk past SPOOL_BYTES, and
        # uploaded from there: a batch's requests are never held whole.
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            async for line in lines:
                row = {
                    "custom_id": line.job_id,
                    "method": "POST",
                    "url": ENDPOINT,
                    "body": self.adapter.body(line),
                }
                spool.write(json.dumps(row).encode() + b"\n")
            spool.seek(0)
            client = self.adapter.client
            try:
                uploaded = await client.files.create(file=(f"{tag}.jsonl", spool), purpose="batch")
                batch = await client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint=ENDPOINT,
                    completion_window="24h",
                    metadata={BATCH_TAG: tag},
                )
            except openai.OpenAIError as err:
                raise self._failure(err) from err
        return batch.id

    async def status(self, provider_batch_id: str) -> BatchStatus:
        try:
            batch = await self.adapter.client.batches.retrieve(provider_batch_id)
        except openai.OpenAIError as err:
            raise classify(err, self.name) from err
        return BatchStatus(
            batch.status,
            running=batch.status in ("in_progress", "finalizing"),
            ended=batch.status in ENDED,
        )

    async def cancel(self, provider_batch_id: str) -> None:
        try:
            await self.adapter.client.batches.cancel(provider_batch_id)
        except openai.OpenAIError as err:
            raise classify(err, self.name) from err

    async def results(self, provider_batch_id: str) -> AsyncIterator[ResultLine]:
        client = self.adapter.client
        try:
            batch = await client.batches.retrieve(provider_batch_id)
            for file_id in (batch.output_file_id, batch.error_file_id):
                if not file_id:
                    continue
                async with client.files.with_streaming_response.content(file_id) as content:
                    async for line in content.iter_lines():
                        if line.strip():
                            yield read_result_line(self.name, line, self.line_result)
        except openai.OpenAIError as err:
            raise classify(err, self.name) from err

    def line_result(self, custom_id: str, row: dict[str, Any]) -> LineResult:
        """One line of an output or error file."""
        response, error = row.get("response"), row.get("error")
        if isinstance(response, dict):
            status = int(response.get("status_code") or 0)
            given = response.get("body")
            body: dict[str, Any] = given if isinstance(given, dict) else {}
            request_id = response.get("request_id")
            if status == 200:
                return LineResult(custom_id, result=self._completion(body, request_id))
            given = body.get("error")
            detail: dict[str, Any] = given if isinstance(given, dict) else {}
            failure = status_failure(
                self.name, status, {}, str(detail.get("message") or body)[:500], request_id
            )
            return LineResult(custom_id, error=failure)
        if isinstance(error, dict) and error.get("code") in NOT_RUN:
            return LineResult(custom_id)
        return LineResult(
            custom_id,
            error=AdapterError(ErrorKind.UNKNOWN, f"{self.name}: batch line failed: {error}"),
        )

    def _completion(self, body: dict[str, Any], request_id: str | None) -> AttemptResult:
        try:
            answer = ChatCompletion.model_validate(body)
        except ValidationError as err:
            raise AdapterError(ErrorKind.PARSE, f"{self.name}: unreadable completion") from err
        choice = next((c for c in answer.choices if c.index == 0), None)
        if choice is None:
            raise AdapterError(ErrorKind.PARSE, f"{self.name}: a completion without a choice")
        usage = answer.usage or _Usage()
        request_id = request_id or answer.id
        return AttemptResult(
            text=(choice.message.content or "") + (choice.message.refusal or ""),
            provider=self.name,
            model=(answer.model or self.adapter.model)[:128],
            provider_request_id=request_id[:255] if request_id else None,
            finish_reason=choice.finish_reason[:64] if choice.finish_reason else None,
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            tool_calls=[
                answered_call(i, call.id, call.function.name, call.function.arguments)
                for i, call in enumerate(choice.message.tool_calls)
            ]
            if choice.message.tool_calls
            else None,
        )


def response_format(wanted: OutputSchema) -> dict[str, Any]:
    """A job's output schema as Chat Completions asks for it: OpenAI's structured outputs
    (`json_schema`, strict where the job says so), or its JSON mode (`json_object`)."""
    if wanted.any_object:
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": wanted.name, "schema": wanted.json_schema}
    if wanted.description is not None:
        schema["description"] = wanted.description
    if wanted.strict is not None:
        schema["strict"] = wanted.strict
    return {"type": "json_schema", "json_schema": schema}
