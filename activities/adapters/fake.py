"""The `fake` provider: deterministic output from the prompt, latency and failures on request."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any

from activities.adapters.base import AdapterRequest, InvalidOptions, parse_options
from activities.adapters.options import FakeOptions, PromptOptions
from activities.errors import AdapterError
from projections.lifecycle import AttemptResult, ErrorKind


def fake_output(prompt: str) -> str:
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return f"[fake:{digest}] {prompt}"


class FakeAdapter:
    """Only where it is turned on (`PROMPTJOBS_FAKE_ADAPTER`): off, a job naming it is refused
    at submission, and a worker that has it off fails such a job (`provider_4xx`) unrun."""

    name = "fake"

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled

    @property
    def configured(self) -> bool:
        return self.enabled

    def validate(self, options: Mapping[str, Any]) -> None:
        if not self.enabled:
            raise InvalidOptions(
                "the fake provider is off on this deployment: name a real provider in "
                "options.provider (or set PROMPTJOBS_FAKE_ADAPTER=true where it should be on)"
            )
        self._behaviour(options)

    @staticmethod
    def _behaviour(options: Mapping[str, Any]) -> FakeOptions:
        return parse_options(PromptOptions, dict(options), "options").fake or FakeOptions()

    async def complete(self, request: AdapterRequest) -> AttemptResult:
        self.validate(request.options)
        behaviour = self._behaviour(request.options)
        if behaviour.latency_ms:
            await asyncio.sleep(behaviour.latency_ms / 1000)
        if request.attempt <= len(behaviour.fail):
            kind = behaviour.fail[request.attempt - 1]
            if kind is ErrorKind.STUCK:
                # A provider that never answers: only the hard ceiling or a cancel ends it.
                await asyncio.Event().wait()
            raise AdapterError(
                kind,
                f"fake adapter: injected {kind.value} on attempt {request.attempt}",
                retry_after_s=behaviour.retry_after_s if kind is ErrorKind.RATE_LIMIT else None,
            )
        text = fake_output(request.prompt)
        return AttemptResult(
            text=text,
            provider=self.name,
            model=str(request.options.get("model") or "fake-1"),
            provider_request_id=None,
            finish_reason="stop",
            input_tokens=len(request.prompt.split()),
            output_tokens=len(text.split()),
            latency_ms=behaviour.latency_ms,
        )
