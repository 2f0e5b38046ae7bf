"""OpenAI's Chat Completions: a `/v1/chat/completions` request (a call, or a batch's line) as
the job it submits, and the `chat.completion` (or its chunks) its answer is.

A request is a whole conversation: `messages` in the one format the adapters take
(activities/adapters/conversation.py), `tools` and `tool_choice`, the sampling fields. What
OpenAI has and promptjobs cannot honour is a 400 naming it, never dropped in silence."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from activities.adapters.base import AdapterRegistry, parse_options
from activities.adapters.conversation import Messages, Tool, ToolChoice
from activities.adapters.json_types import NO_NUL
from activities.adapters.options import PromptOptions, StopText
from api.openai.responses import (
    CUT_AT_LIMIT,
    METADATA_PAIRS,
    PromptjobsExtras,
    UnsupportedParameter,
    output_schema_of,
)
from api.schemas import tool_calls_out
from projections.models import Job, Prompt, Response
from projections.writes import Submission

# Chat parameters that change nothing here: accepted and not kept.
IGNORED = frozenset({"user", "safety_identifier", "prompt_cache_key", "store"})
# The SDK sends these as their defaults: fine as such, refused otherwise.
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "logprobs": (False,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: StrictBool | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: StrictStr = Field(min_length=1, max_length=200, pattern=NO_NUL)
    messages: Messages
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    seed: int | None = None
    stop: StopText | Annotated[list[StopText], Field(min_length=1, max_length=4)] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    response_format: dict[StrictStr, Any] | None = None
    metadata: dict[StrictStr, StrictStr] | None = Field(default=None, max_length=METADATA_PAIRS)
    # "flex": the line runs as a deferrable job (CreateResponse.deferrable).
    service_tier: StrictStr | None = None
    promptjobs: PromptjobsExtras = Field(default_factory=PromptjobsExtras)

    def submission(
        self,
        adapters: AdapterRegistry,
        *,
        idempotency_key: str | None = None,
        in_batch: bool = False,
    ) -> Submission:
        """The conversation and its job, as the wire says them; raises UnsupportedParameter
        or InvalidOptions for what Chat Completions' shape cannot carry here. The
        submission's own rules are the job service's (services/jobs.py)."""
        for name, value in (self.model_extra or {}).items():
            if name in IGNORED or value is None or value in DEFAULTS.get(name, ()):
                continue
            raise UnsupportedParameter(
                name, f"`{name}` is not supported by promptjobs: leave it out (see docs/openai.md)"
            )
        if self.stream and in_batch:
            raise UnsupportedParameter("stream", "a batch line cannot stream: leave it out")
        options = self.promptjobs.options_for(adapters, self.model)
        max_tokens = self.max_completion_tokens or self.max_tokens
        if max_tokens is not None:
            options["max_tokens"] = max_tokens
        sent = self.model_dump(
            mode="json",
            exclude_unset=True,
            include={
                "temperature",
                "top_p",
                "seed",
                "stop",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
            },
            exclude_none=True,
        )
        options.update(sent)
        wanted = output_schema_of("response_format", self.response_format, flat=False)
        if wanted is not None:
            options["output_schema"] = wanted
        if self.service_tier == "flex" and in_batch:
            options["deferrable"] = True
        parse_options(PromptOptions, options, "promptjobs.options")
        messages = [m.model_dump(mode="json", exclude_unset=True) for m in self.messages]
        return Submission(
            text="",
            messages=messages,
            priority=self.promptjobs.priority,
            max_attempts=self.promptjobs.max_attempts,
            options=options,
            idempotency_key=idempotency_key,
            openai={"model": self.model, "metadata": self.metadata or {}, "api": "chat"},
        )


def completion_id(job_id: str) -> str:
    return "chatcmpl-" + job_id.removeprefix("job_")


def finish_reason_of(answer: Response) -> str:
    """OpenAI's finish reason for an answer (each adapter says one of its words already)."""
    if answer.tool_calls:
        return "tool_calls"
    if answer.finish_reason in CUT_AT_LIMIT:
        return "length"
    return "content_filter" if answer.finish_reason == "content_filter" else "stop"


def usage_of(job: Job) -> dict[str, Any]:
    return {
        "prompt_tokens": job.input_tokens,
        "completion_tokens": job.output_tokens,
        "total_tokens": job.input_tokens + job.output_tokens,
    }


def chat_completion(prompt: Prompt, job: Job, answer: Response) -> dict[str, Any]:
    """The `chat.completion` of a succeeded job (a call's, or a batch line's)."""
    kept = prompt.openai or {}
    calls = tool_calls_out(answer.tool_calls)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.text if answer.text or not calls else None,
        "refusal": None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = [call.model_dump(mode="json") for call in calls]
    return {
        "id": completion_id(job.job_id),
        "object": "chat.completion",
        "created": int(answer.created_at.timestamp()),
        "model": kept.get("model") or answer.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason_of(answer),
            }
        ],
        "usage": usage_of(job),
        "service_tier": "flex" if (job.options or {}).get("deferrable") else "default",
        "system_fingerprint": None,
        "promptjobs": {"job_id": job.job_id, "prompt_id": prompt.prompt_id},
    }
