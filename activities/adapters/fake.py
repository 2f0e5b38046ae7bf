"""The `fake` provider: deterministic output from the prompt, latency and failures on request."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from activities.adapters.base import AdapterRequest, AdapterResult, parse_options
from activities.adapters.chat import ChatOptions
from activities.errors import AdapterError, ErrorKind


class FakeBehaviour(BaseModel):
    """`options.fake`: attempt i fails with fail[i-1] while i <= len(fail), then succeeds."""

    model_config = ConfigDict(extra="forbid")

    latency_ms: int = Field(default=0, ge=0, le=3_600_000)
    fail: list[ErrorKind] = Field(default_factory=list, max_length=20)
    retry_after_s: float | None = Field(default=None, ge=0, le=86_400)


class FakeOptions(ChatOptions):
    """The options a real provider takes, so a job can switch providers, plus `fake`."""

    fake: FakeBehaviour | None = None


def fake_output(prompt: str) -> str:
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return f"[fake:{digest}] {prompt}"


class FakeAdapter:
    name = "fake"
    configured = True

    def validate(self, options: Mapping[str, Any]) -> None:
        self._behaviour(options)

    @staticmethod
    def _behaviour(options: Mapping[str, Any]) -> FakeBehaviour:
        return parse_options(FakeOptions, dict(options), "options").fake or FakeBehaviour()

    async def complete(self, request: AdapterRequest) -> AdapterResult:
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
        return AdapterResult(
            text=text,
            provider=self.name,
            model=str(request.options.get("model") or "fake-1"),
            provider_request_id=None,
            finish_reason="stop",
            input_tokens=len(request.prompt.split()),
            output_tokens=len(text.split()),
            latency_ms=behaviour.latency_ms,
        )
