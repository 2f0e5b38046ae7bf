"""The `fake` provider: deterministic output from the prompt (a conversation's last message),
latency and failures on request, a tool call where tools are offered, JSON that fits the
job's output schema where it has one, and scripted answers on request."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re

from activities.adapters.base import AdapterRequest, InvalidOptions, StreamedOutput
from activities.adapters.conversation import (
    ToolChoiceFunction,
    sample_arguments,
    sample_value,
    text_of,
)
from activities.adapters.options import FakeOptions, PromptOptions
from activities.errors import AdapterError
from projections.domain.lifecycle import AttemptResult, ErrorKind


def fake_output(prompt: str) -> str:
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return f"[fake:{digest}] {prompt}"


def fake_chunks(text: str) -> list[str]:
    """How the fake streams `text`: a word (with the space after it) a chunk."""
    return re.findall(r"\s*\S+\s*", text) or [text]


# Injected failures that a real provider can hit in the middle of a stream: the fake streams
# the first half of its answer before failing with one of these (the rest fail up front).
MID_STREAM = frozenset(
    {ErrorKind.PROVIDER_5XX, ErrorKind.TIMEOUT, ErrorKind.UNKNOWN, ErrorKind.WORKER_CRASH}
)


def scripted_calls(request: AdapterRequest) -> list[dict[str, str]]:
    """The fake's tool calls: offered tools and a conversation that does not end in a tool's
    result, it calls the one `tool_choice` names (else the first) with arguments that fit its
    parameters' types; otherwise it answers in text (a tool's result too)."""
    options = request.options
    conversation = request.conversation
    if not options.tools or options.tool_choice == "none" or conversation[-1].role == "tool":
        return []
    chosen = options.tool_choice
    name = chosen.function.name if isinstance(chosen, ToolChoiceFunction) else None
    tool = next((t for t in options.tools if t.function.name == name), options.tools[0])
    digest = hashlib.sha256(request.prompt.encode()).hexdigest()[:12]
    return [
        {
            "id": f"call_fake_{digest}",
            "name": tool.function.name,
            "arguments": json.dumps(sample_arguments(tool.function.parameters)),
        }
    ]


class FakeAdapter:
    """Only where it is turned on (`PROMPTJOBS_FAKE_ADAPTER`): off, a job naming it is refused
    at submission, and a worker that has it off fails such a job (`provider_4xx`) unrun."""

    name = "fake"
    model = "fake-1"

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled

    @property
    def configured(self) -> bool:
        return self.enabled

    def check(self, options: PromptOptions) -> None:
        if not self.enabled:
            raise InvalidOptions(
                "the fake provider is off on this deployment: name a real provider in "
                "options.provider (or set PROMPTJOBS_FAKE_ADAPTER=true where it should be on)"
            )

    async def complete(self, request: AdapterRequest, output: StreamedOutput) -> AttemptResult:
        """Streams the answer a word at a time over `latency_ms`; an injected failure comes
        at the end of that time (after half the answer, for a failure that can cut a stream)."""
        self.check(request.options)
        behaviour = request.options.fake or FakeOptions()
        # The answer to the conversation's last message (a prompt's text; a tool's result).
        last = text_of(request.conversation[-1].content)
        calls = scripted_calls(request)
        text = "" if calls else self._answer(request, behaviour, last)
        chunks = fake_chunks(text)
        pause_s = behaviour.latency_ms / 1000 / len(chunks)
        failing = (
            behaviour.fail[request.attempt - 1] if request.attempt <= len(behaviour.fail) else None
        )
        streamed = (
            chunks
            if failing is None
            else chunks[: len(chunks) // 2]
            if failing in MID_STREAM
            else []
        )
        # Counted as it goes, not a tokenizer's: a word stands for a token. Said at once, as a
        # stream cut midway (a cancel) keeps what was counted so far.
        output.usage(input_tokens=len(request.prompt.split()), output_tokens=0, estimated=True)
        for sent, chunk in enumerate(streamed, start=1):
            if pause_s:
                await asyncio.sleep(pause_s)
            output.delta(chunk)
            output.usage(output_tokens=sent, estimated=True)
        if failing is not None:
            if pause_s:
                await asyncio.sleep(pause_s * (len(chunks) - len(streamed)))
            if failing is ErrorKind.STUCK:
                # A provider that never answers: only the hard ceiling or a cancel ends it.
                await asyncio.Event().wait()
            raise AdapterError(
                failing,
                f"fake adapter: injected {failing.value} on attempt {request.attempt}",
                retry_after_s=behaviour.retry_after_s if failing is ErrorKind.RATE_LIMIT else None,
            )
        for index, call in enumerate(calls):
            output.tool_call(index, call_id=call["id"], name=call["name"])
            output.tool_call(index, arguments=call["arguments"])
        return AttemptResult(
            text=output.text,
            provider=self.name,
            model=request.options.model or self.model,
            provider_request_id=None,
            finish_reason="tool_calls" if calls else "stop",
            tool_calls=output.tool_calls,
            input_tokens=output.input_tokens,
            output_tokens=output.output_tokens,
            latency_ms=behaviour.latency_ms,
            usage_estimated=True,
        )

    @staticmethod
    def _answer(request: AdapterRequest, behaviour: FakeOptions, last: str) -> str:
        """The text of a successful call: the next scripted answer, else JSON fitting the
        job's output schema where it has one, else the usual echo of `last`."""
        succeeded_before = request.attempt - 1 - len(behaviour.fail[: request.attempt - 1])
        if succeeded_before < len(behaviour.answers):
            return behaviour.answers[succeeded_before]
        wanted = request.options.output_schema
        if wanted is not None:
            return json.dumps(sample_value(wanted.json_schema))
        return fake_output(last)
