"""The `openai` provider: chat completions on any OpenAI-compatible endpoint (OpenAI, vLLM,
Ollama, LiteLLM, OpenRouter…) streamed through the official SDK, with its failures classified."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

import openai
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field, SecretStr

from activities.adapters.base import AdapterRequest, StreamedOutput
from activities.adapters.chat import (
    ChatAdapter,
    ChatOptions,
    StreamedAnswer,
    chat_result,
    event_stream,
    read_event,
    status_failure,
    stream_failure,
    streamed_call,
    transport_failure,
)
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


class _Delta(BaseModel):
    content: str | None = None
    refusal: str | None = None


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
        if choice.finish_reason:
            answer.finish_reason = choice.finish_reason
            # The last choice chunk; the usage chunk may follow, but the answer is whole.
            answer.finished = True
    if chunk.usage is not None:
        output.usage(
            input_tokens=chunk.usage.prompt_tokens, output_tokens=chunk.usage.completion_tokens
        )


class OpenAICompatAdapter(ChatAdapter[ChatOptions]):
    name = "openai"
    credential = "PROMPTJOBS_OPENAI_API_KEY"
    default_base_url = "https://api.openai.com/v1"
    options_shape = ChatOptions

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

    async def complete(self, request: AdapterRequest, output: StreamedOutput) -> AttemptResult:
        options = self.options(request.options)
        messages: list[ChatCompletionMessageParam] = []
        if options.system:
            messages.append({"role": "system", "content": options.system})
        messages.append({"role": "user", "content": request.prompt})
        max_tokens = options.max_tokens or self.max_tokens
        limit = openai.omit if max_tokens is None else max_tokens
        model = options.model or self.model
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
                    model=model,
                    messages=messages,
                    temperature=openai.omit if options.temperature is None else options.temperature,
                    max_tokens=limit if self.max_tokens_field == "max_tokens" else openai.omit,
                    max_completion_tokens=limit
                    if self.max_tokens_field == "max_completion_tokens"
                    else openai.omit,
                    stream=True,
                    stream_options={"include_usage": True},
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
