"""The `anthropic` provider: the Messages API through the official SDK, with its failures
classified."""

from __future__ import annotations

import time
from functools import cached_property

import anthropic
from anthropic.types import MessageParam
from pydantic import BaseModel, SecretStr, field_validator

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
TRANSPORT_KINDS: tuple[tuple[type[Exception], ErrorKind], ...] = (
    (anthropic.APITimeoutError, ErrorKind.TIMEOUT),
    (anthropic.APIConnectionError, ErrorKind.PROVIDER_5XX),
    (anthropic.APIResponseValidationError, ErrorKind.PARSE),
    (anthropic.CredentialsError, ErrorKind.AUTH),
)


def classify(err: anthropic.AnthropicError, provider: str = "anthropic") -> AdapterError:
    """An SDK failure as an ErrorKind: by HTTP status when there is one, else by type. An
    overloaded API (529) is a 5xx like any other."""
    if isinstance(err, anthropic.APIStatusError):
        detail = err.api_message or err.message
        headers = err.response.headers
        return status_failure(provider, err.status_code, headers, detail, err.request_id)
    return transport_failure(provider, err, TRANSPORT_KINDS)


class AnthropicOptions(ChatOptions):
    @field_validator("temperature")
    @classmethod
    def _no_temperature(cls, value: float | None) -> float | None:
        # API version 2026-10-21 (the one SDK 2.x speaks) refuses every sampling parameter.
        if value is not None:
            raise ValueError(
                "the Anthropic Messages API takes no temperature since API version "
                "2026-10-21; leave it out"
            )
        return value


class _Block(BaseModel):
    type: str
    text: str | None = None


class _Usage(BaseModel):
    input_tokens: int | None = None
    output_tokens: int | None = None


class MessageAnswer(BaseModel):
    """The fields of a Messages API answer we record."""

    id: str | None = None
    model: str | None = None
    content: list[_Block]
    stop_reason: str | None = None
    usage: _Usage | None = None


class AnthropicMessagesAdapter(ChatAdapter[AnthropicOptions]):
    name = "anthropic"
    credential = "PROMPTJOBS_ANTHROPIC_API_KEY"
    default_base_url = "https://api.anthropic.com"
    options_shape = AnthropicOptions

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

    async def complete(self, request: AdapterRequest) -> AttemptResult:
        options = self.options(request.options)
        messages: list[MessageParam] = [{"role": "user", "content": request.prompt}]
        client = self.client
        started = time.monotonic()
        try:
            async with deadline(self.name, self.timeout_s):
                raw = await client.messages.with_raw_response.create(
                    model=options.model or self.model,
                    max_tokens=options.max_tokens or self.max_tokens,
                    messages=messages,
                    system=options.system or anthropic.omit,
                )
                body = await raw.read()
        except anthropic.AnthropicError as err:
            raise classify(err, self.name) from err
        answer = read_answer(self.name, MessageAnswer, body, "Messages API answer")
        usage = answer.usage or _Usage()
        return chat_result(
            provider=self.name,
            text="".join(b.text or "" for b in answer.content if b.type == "text"),
            model=answer.model or options.model or self.model,
            request_id=raw.headers.get("request-id") or answer.id,
            finish_reason=answer.stop_reason,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            started=started,
        )
