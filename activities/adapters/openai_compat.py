"""The `openai` provider: chat completions on any OpenAI-compatible endpoint (OpenAI, vLLM,
Ollama, LiteLLM, OpenRouter…) through the official SDK, with its failures classified."""

from __future__ import annotations

import time
from functools import cached_property
from typing import Literal

import openai
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field, SecretStr

from activities.adapters.base import AdapterRequest
from activities.adapters.chat import (
    ChatAdapter,
    ChatOptions,
    chat_result,
    deadline,
    read_answer,
    status_failure,
    transport_failure,
)
from activities.errors import AdapterError
from projections.lifecycle import AttemptResult, ErrorKind

# The SDK's failures that carry no HTTP status, most specific first (a timeout is also a
# connection error).
TRANSPORT_KINDS: tuple[tuple[type[openai.OpenAIError], ErrorKind], ...] = (
    (openai.APITimeoutError, ErrorKind.TIMEOUT),
    (openai.APIConnectionError, ErrorKind.PROVIDER_5XX),
    (openai.APIResponseValidationError, ErrorKind.PARSE),
)


def classify(err: openai.OpenAIError, provider: str = "openai") -> AdapterError:
    """An SDK failure as an ErrorKind: by HTTP status when there is one, else by type."""
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
    return transport_failure(provider, err, TRANSPORT_KINDS)


class _Message(BaseModel):
    content: str | None = None
    refusal: str | None = None


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _Usage(BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class ChatCompletionAnswer(BaseModel):
    """The fields of a chat completion we record; compatible servers differ in the rest."""

    id: str | None = None
    model: str | None = None
    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage | None = None


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

    async def complete(self, request: AdapterRequest) -> AttemptResult:
        options = self.options(request.options)
        messages: list[ChatCompletionMessageParam] = []
        if options.system:
            messages.append({"role": "system", "content": options.system})
        messages.append({"role": "user", "content": request.prompt})
        max_tokens = options.max_tokens or self.max_tokens
        limit = openai.omit if max_tokens is None else max_tokens
        client = self.client
        started = time.monotonic()
        try:
            async with deadline(self.name, self.timeout_s):
                raw = await client.chat.completions.with_raw_response.create(
                    model=options.model or self.model,
                    messages=messages,
                    temperature=openai.omit if options.temperature is None else options.temperature,
                    max_tokens=limit if self.max_tokens_field == "max_tokens" else openai.omit,
                    max_completion_tokens=limit
                    if self.max_tokens_field == "max_completion_tokens"
                    else openai.omit,
                )
        except openai.OpenAIError as err:
            raise classify(err, self.name) from err
        answer = read_answer(self.name, ChatCompletionAnswer, raw.content, "chat completion")
        choice = answer.choices[0]
        usage = answer.usage or _Usage()
        return chat_result(
            provider=self.name,
            text=choice.message.content or choice.message.refusal or "",
            model=answer.model or options.model or self.model,
            request_id=raw.headers.get("x-request-id") or answer.id,
            finish_reason=choice.finish_reason,
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            started=started,
        )
