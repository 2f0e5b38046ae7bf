"""The `anthropic` provider: the Messages API streamed through the official SDK, with its
failures classified."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

import anthropic
from pydantic import BaseModel, Field, SecretStr, ValidationError

from activities.adapters.base import (
    AdapterRequest,
    InvalidOptions,
    StreamedOutput,
    answered_call,
)
from activities.adapters.batch import (
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
from activities.adapters.conversation import (
    DATA_URL,
    AssistantMessage,
    DeveloperMessage,
    ImagePart,
    Message,
    SystemMessage,
    TextPart,
    ToolMessage,
    text_of,
)
from activities.adapters.options import PromptOptions
from activities.errors import AdapterError
from projections.domain.lifecycle import AttemptResult, ErrorKind

# The SDK's failures that carry no HTTP status, most specific first (a timeout is also a
# connection error).
TRANSPORT_KINDS: tuple[tuple[type[Exception], ErrorKind], ...] = (
    (anthropic.APITimeoutError, ErrorKind.TIMEOUT),
    (anthropic.APIConnectionError, ErrorKind.PROVIDER_5XX),
    (anthropic.APIResponseValidationError, ErrorKind.PARSE),
    (anthropic.CredentialsError, ErrorKind.AUTH),
)


def classify(err: anthropic.AnthropicError, provider: str = "anthropic") -> AdapterError:
    """An SDK failure as an ErrorKind: by HTTP status when there is one, by the error's type
    for an `event: error` in the middle of a stream, else by type. An overloaded API (529) is
    a 5xx like any other."""
    if isinstance(err, anthropic.APIStatusError):
        detail = err.api_message or err.message
        if 200 <= err.status_code < 300:
            # The SDK raises an `event: error` as a status error of the stream's own 200.
            status = STREAM_ERRORS.get(err.type or "", 500)
            return stream_failure(provider, status, err.type or "error", detail, err.request_id)
        headers = err.response.headers
        return status_failure(provider, err.status_code, headers, detail, err.request_id)
    return transport_failure(provider, err, TRANSPORT_KINDS)


# An `event: error` in a stream, by its type: the HTTP status the same error has before a
# stream starts (the API's error table). A type not here is the server's failure (500): it had
# accepted the request.
STREAM_ERRORS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "conflict_error": 409,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class _Usage(BaseModel):
    input_tokens: int | None = None
    output_tokens: int | None = None


class _Event(BaseModel):
    type: str


class _Message(BaseModel):
    id: str | None = None
    model: str | None = None
    usage: _Usage | None = None


class MessageStart(BaseModel):
    message: _Message


class _TextDelta(BaseModel):
    type: str
    text: str | None = None
    partial_json: str | None = None


class BlockDelta(BaseModel):
    index: int = 0
    delta: _TextDelta


class _StartedBlock(BaseModel):
    type: str
    id: str | None = None
    name: str | None = None


class BlockStart(BaseModel):
    index: int = 0
    content_block: _StartedBlock


class _StopDelta(BaseModel):
    stop_reason: str | None = None


class MessageDelta(BaseModel):
    delta: _StopDelta
    usage: _Usage | None = None


# Anthropic's stop reasons in the words every adapter uses (lifecycle.FINISH_REASONS).
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def finish_reason(stop_reason: str | None) -> str | None:
    return STOP_REASONS.get(stop_reason, stop_reason) if stop_reason else None


def read_stream_event(
    provider: str, data: object, answer: StreamedAnswer, output: StreamedOutput
) -> None:
    """One event of the Messages stream: text and tool calls (`tool_use` blocks, their
    arguments in `input_json_delta`s) are recorded; what else comes (thinking, events added
    later) passes unread."""
    kind = read_event(provider, _Event, data, "stream event").type
    if kind == "message_start":
        message = read_event(provider, MessageStart, data, "message_start event").message
        answer.model = message.model or answer.model
        answer.answer_id = message.id
        if message.usage is not None:
            # Its output count is a placeholder; message_delta gives the real one.
            output.usage(input_tokens=message.usage.input_tokens)
    elif kind == "content_block_start":
        start = read_event(provider, BlockStart, data, "content_block_start event")
        if start.content_block.type == "tool_use":
            tool = start.content_block
            output.tool_call(start.index, call_id=tool.id, name=tool.name)
    elif kind == "content_block_delta":
        piece = read_event(provider, BlockDelta, data, "content_block_delta event")
        if piece.delta.type == "text_delta":
            output.delta(piece.delta.text or "")
        elif piece.delta.type == "input_json_delta":
            output.tool_call(piece.index, arguments=piece.delta.partial_json or "")
    elif kind == "message_delta":
        event = read_event(provider, MessageDelta, data, "message_delta event")
        answer.finish_reason = finish_reason(event.delta.stop_reason) or answer.finish_reason
        if event.usage is not None:
            output.usage(
                input_tokens=event.usage.input_tokens, output_tokens=event.usage.output_tokens
            )
    elif kind == "message_stop":
        answer.finished = True


def anthropic_messages(conversation: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as Messages API turns: its system and developer text goes to
    `system` (not here); an assistant's tool calls are `tool_use` blocks; tool results are
    `tool_result` blocks of a user turn; turns of one role in a row are one turn."""
    turns: list[dict[str, Any]] = []
    for message in conversation:
        if isinstance(message, SystemMessage | DeveloperMessage):
            continue
        role = "assistant" if isinstance(message, AssistantMessage) else "user"
        blocks = content_blocks(message)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def content_blocks(message: Message) -> list[dict[str, Any]]:
    if isinstance(message, ToolMessage):
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": text_of(message.content),
            }
        ]
    content = message.content
    parts: list[Any] = (
        [TextPart(type="text", text=content)] if isinstance(content, str) else list(content or ())
    )
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, ImagePart):
            blocks.append({"type": "image", "source": image_source(part.image_url.url)})
        elif part.text:
            blocks.append({"type": "text", "text": part.text})
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls or ():
            arguments = json.loads(call.function.arguments)
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.function.name,
                    # The API takes an object; other JSON the model wrote is kept whole.
                    "input": arguments if isinstance(arguments, dict) else {"value": arguments},
                }
            )
    return blocks


def image_source(url: str) -> dict[str, Any]:
    found = DATA_URL.match(url)
    if found is None:
        return {"type": "url", "url": url}
    media_type, data = found.groups()
    return {"type": "base64", "media_type": media_type, "data": "".join(data.split())}


# A `json_object` job's ask of Claude, which has no JSON mode.
JSON_OBJECT_ASK = "Answer with one JSON object and nothing else: no prose, no code fence."


def anthropic_tool_choice(options: PromptOptions) -> dict[str, Any] | None:
    """`tool_choice` in the Messages API's words (`required` is `any`), with parallel calls
    turned off where the job says so."""
    choice = options.tool_choice
    if choice is None and options.parallel_tool_calls is None:
        return None
    if choice is None:
        if not options.tools:
            return None
        picked: dict[str, Any] = {"type": "auto"}
    elif isinstance(choice, str):
        picked = {"type": {"auto": "auto", "none": "none", "required": "any"}[choice]}
    else:
        picked = {"type": "tool", "name": choice.function.name}
    if options.parallel_tool_calls is False and picked["type"] != "none":
        picked["disable_parallel_tool_use"] = True
    return picked


class AnthropicMessagesAdapter(ChatAdapter):
    name = "anthropic"
    credential = "PROMPTJOBS_ANTHROPIC_API_KEY"
    default_base_url = "https://api.anthropic.com"

    def __init__(
        self,
        *,
        api_key: SecretStr | None,
        base_url: str | None,
        timeout_s: float,
        model: str,
        max_tokens: int,
    ) -> None:
        super().__init__(api_key=api_key, base_url=base_url, timeout_s=timeout_s, model=model)
        self.max_tokens = max_tokens

    def refuse(self, options: PromptOptions) -> None:
        # API version 2026-10-21 (the one SDK 2.x speaks) refuses every sampling parameter.
        for name in ("temperature", "top_p"):
            if getattr(options, name) is not None:
                raise InvalidOptions(
                    f"options.{name}: the Anthropic Messages API takes no {name} since API "
                    "version 2026-10-21; leave it out"
                )
        if options.seed is not None:
            raise InvalidOptions(
                "options.seed: the Anthropic Messages API has no seed; leave it out"
            )

    @cached_property
    def client(self) -> anthropic.AsyncAnthropic:
        # An explicit key and base URL, so the SDK consults no ANTHROPIC_* variable or profile
        # behind Settings' back; no SDK retries, since Temporal runs the attempts.
        return anthropic.AsyncAnthropic(
            api_key=self.secret(),
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=0,
        )

    def params(self, request: AdapterRequest) -> dict[str, Any]:
        """The Messages request the job makes (without `stream`): one call's, or one
        request's of a message batch."""
        options = request.options
        conversation = request.conversation
        params: dict[str, Any] = {
            "model": options.model or self.model,
            "max_tokens": options.max_tokens or self.max_tokens,
            "messages": anthropic_messages(conversation),
        }
        system = [options.system or ""] + [
            text_of(m.content) for m in conversation if m.role in ("system", "developer")
        ]
        wanted = options.output_schema
        if wanted is not None and not wanted.any_object:
            # Claude's native structured outputs; constraints it does not take (minimum,
            # lengths, …) the SDK's transform moves into descriptions, and our check of the
            # answer still holds them.
            schema = anthropic.transform_schema(wanted.json_schema)
            params["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
        elif wanted is not None:
            # No JSON mode here: asked in words, and the answer checked as everywhere.
            system.append(JSON_OBJECT_ASK)
        if any(system):
            params["system"] = "\n\n".join(text for text in system if text)
        if options.stop is not None:
            params["stop_sequences"] = (
                [options.stop] if isinstance(options.stop, str) else options.stop
            )
        if options.tools:
            params["tools"] = [
                {
                    "name": tool.function.name,
                    **(
                        {"description": tool.function.description}
                        if tool.function.description
                        else {}
                    ),
                    "input_schema": tool.function.parameters
                    or {"type": "object", "properties": {}},
                }
                for tool in options.tools
            ]
        if (choice := anthropic_tool_choice(options)) is not None:
            params["tool_choice"] = choice
        return params

    def batches(self) -> AnthropicBatches:
        return AnthropicBatches(self)

    async def complete(self, request: AdapterRequest, output: StreamedOutput) -> AttemptResult:
        params = self.params(request)
        model = str(params["model"])
        client = self.client
        answer = StreamedAnswer()
        started = output.call_begins()
        try:
            async with (
                streamed_call(self.name, self.timeout_s),
                # Leaving the block closes the response, and with it the connection, however
                # it is left: a failure, or the activity's cancellation.
                client.messages.with_streaming_response.create(**params, stream=True) as raw,
            ):
                request_id = raw.headers.get("request-id")
                output.answered_with(raw.headers)
                event_stream(self.name, raw.headers)
                async for data in await raw.parse(to=anthropic.AsyncStream[object]):
                    read_stream_event(self.name, data, answer, output)
        except anthropic.AnthropicError as err:
            if isinstance(err, anthropic.APIStatusError):
                output.answered_with(err.response.headers)
            raise classify(err, self.name) from err
        answer.check_finished(self.name, "message_stop event", output)
        return chat_result(
            provider=self.name,
            output=output,
            answer=answer,
            model=model,
            request_id=request_id,
            started=started,
        )


class _Block(BaseModel):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None


class WholeMessage(BaseModel):
    """The fields of a whole (unstreamed) message we read: a batch request's answer."""

    id: str | None = None
    model: str | None = None
    content: list[_Block] = Field(default_factory=list)
    stop_reason: str | None = None
    usage: _Usage | None = None


class _ErrorDetail(BaseModel):
    type: str = "api_error"
    message: str = ""


class _ErrorBody(BaseModel):
    error: _ErrorDetail = Field(default_factory=_ErrorDetail)


class AnthropicBatches:
    """Anthropic's Message Batches (activities/adapters/batch.py). A message batch carries no
    metadata, so a batch sent before is found by what it shows: made since our send began,
    holding as many requests (docs/decisions.md)."""

    def __init__(self, adapter: AnthropicMessagesAdapter) -> None:
        self.adapter = adapter
        self.name = adapter.name

    def _failure(self, err: anthropic.AnthropicError) -> Exception:
        if isinstance(err, anthropic.APIStatusError) and err.status_code in (404, 405):
            return BatchUnsupported(
                f"{self.name} at {self.adapter.base_url} has no message batches "
                f"(HTTP {err.status_code} from {err.request.url.path})"
            )
        return classify(err, self.name)

    async def find(self, tag: str, since: datetime, lines: int) -> list[str]:
        # A message batch keeps no tag: what it shows is when it was made and how many
        # requests it holds. Those made since the send began with as many, oldest first.
        oldest = since - CLOCK_SLACK
        found: list[str] = []
        try:
            async for batch in self.adapter.client.messages.batches.list(limit=100):
                if batch.created_at < oldest:
                    break
                counts = batch.request_counts
                held = (
                    counts.processing
                    + counts.succeeded
                    + counts.errored
                    + counts.canceled
                    + counts.expired
                )
                if held == lines:
                    found.append(batch.id)
        except anthropic.AnthropicError as err:
            raise self._failure(err) from err
        return found[::-1]

    async def submit(self, tag: str, model: str, lines: AsyncIterable[AdapterRequest]) -> str:
        # One JSON body holds the whole batch (the SDK builds it whole): up to Anthropic's
        # 256 MB request, held while it is sent (docs/providers.md).
        requests: list[Any] = [
            {"custom_id": line.job_id, "params": self.adapter.params(line)} async for line in lines
        ]
        try:
            batch = await self.adapter.client.messages.batches.create(requests=requests)
        except anthropic.AnthropicError as err:
            raise self._failure(err) from err
        return batch.id

    async def status(self, provider_batch_id: str) -> BatchStatus:
        try:
            batch = await self.adapter.client.messages.batches.retrieve(provider_batch_id)
        except anthropic.AnthropicError as err:
            raise classify(err, self.name) from err
        ended = batch.processing_status == "ended"
        counts = batch.request_counts
        status: str = batch.processing_status
        if ended and counts.expired:
            status = "expired"
        elif ended and counts.canceled:
            status = "cancelled"
        return BatchStatus(status, running=not ended, ended=ended)

    async def cancel(self, provider_batch_id: str) -> None:
        try:
            await self.adapter.client.messages.batches.cancel(provider_batch_id)
        except anthropic.AnthropicError as err:
            raise classify(err, self.name) from err

    async def results(self, provider_batch_id: str) -> AsyncIterator[ResultLine]:
        # The SDK's decoder raises at the first line it cannot parse, ending the read: the
        # lines are read here, each on its own (read_result_line).
        try:
            entries = await self.adapter.client.messages.batches.results(provider_batch_id)
            try:
                async for line in entries.http_response.aiter_lines():
                    if line.strip():
                        yield read_result_line(self.name, line, self.line_result)
            finally:
                await entries.close()
        except anthropic.AnthropicError as err:
            raise classify(err, self.name) from err

    def line_result(self, custom_id: str, row: dict[str, Any]) -> LineResult:
        given = row.get("result")
        result: dict[str, Any] = given if isinstance(given, dict) else {}
        kind = result.get("type")
        if kind == "succeeded":
            try:
                message = WholeMessage.model_validate(result.get("message") or {})
            except ValidationError:
                failure = AdapterError(ErrorKind.PARSE, f"{self.name}: unreadable message")
                return LineResult(custom_id, error=failure)
            usage = message.usage or _Usage()
            text = "".join(block.text or "" for block in message.content if block.type == "text")
            calls = [
                answered_call(
                    i,
                    block.id,
                    block.name or "",
                    json.dumps(block.input if block.input is not None else {}),
                )
                for i, block in enumerate(message.content)
                if block.type == "tool_use"
            ]
            return LineResult(
                custom_id,
                result=AttemptResult(
                    text=text,
                    provider=self.name,
                    model=(message.model or self.adapter.model)[:128],
                    provider_request_id=message.id[:255] if message.id else None,
                    finish_reason=(finish_reason(message.stop_reason) or "")[:64] or None,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    tool_calls=calls or None,
                ),
            )
        if kind == "errored":
            body = _ErrorBody.model_validate(result.get("error") or {})
            status = STREAM_ERRORS.get(body.error.type, 500)
            failure = status_failure(self.name, status, {}, body.error.message, None)
            return LineResult(custom_id, error=failure)
        return LineResult(custom_id)  # canceled, expired: never run
