"""A `/v1/chat/completions` request as a batch line carries it, and the `chat.completion`
its output line answers with."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from activities.adapters.base import AdapterRegistry
from activities.adapters.json_types import NO_NUL
from api.openai.responses import (
    CUT_AT_LIMIT,
    CreateResponse,
    InputMessage,
    PromptjobsExtras,
    UnsupportedParameter,
    submission_of,
)
from projections.models import Job, Prompt, Response
from projections.writes import Submission

# Chat parameters that change nothing here: accepted and not kept.
IGNORED = frozenset({"user", "safety_identifier", "prompt_cache_key", "store"})


class ChatPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ChatPart]


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: StrictStr = Field(min_length=1, max_length=200, pattern=NO_NUL)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    # "flex": the line runs as a deferrable job (CreateResponse.deferrable).
    service_tier: StrictStr | None = None
    promptjobs: PromptjobsExtras = Field(default_factory=PromptjobsExtras)

    def submission(self, adapters: AdapterRegistry) -> Submission:
        """As the Responses request it amounts to (one user message, system text)."""
        for name, value in (self.model_extra or {}).items():
            if name not in IGNORED and value is not None:
                raise UnsupportedParameter(
                    name, f"`{name}` is not supported by promptjobs: leave it out"
                )
        if self.stream:
            raise UnsupportedParameter("stream", "a batch line cannot stream: leave it out")
        items = []
        for i, message in enumerate(self.messages):
            if message.role == "tool":
                raise UnsupportedParameter(f"messages[{i}]", "tool messages are not supported")
            content: Any = message.content
            if not isinstance(content, str):
                content = [
                    {"type": "input_text" if part.type == "text" else part.type, "text": part.text}
                    for part in content
                ]
            items.append(InputMessage.model_validate({"role": message.role, "content": content}))
        request = CreateResponse(
            model=self.model,
            input=items,
            max_output_tokens=self.max_completion_tokens or self.max_tokens,
            temperature=self.temperature,
            metadata=self.metadata,
            service_tier=self.service_tier,
            promptjobs=self.promptjobs,
        )
        return submission_of(request, adapters, in_batch=True)


def chat_completion(prompt: Prompt, job: Job, answer: Response) -> dict[str, Any]:
    """The `chat.completion` body of a succeeded line."""
    kept = prompt.openai or {}
    return {
        "id": "chatcmpl-" + job.job_id.removeprefix("job_"),
        "object": "chat.completion",
        "created": int(answer.created_at.timestamp()),
        "model": kept.get("model") or answer.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer.text, "refusal": None},
                "logprobs": None,
                "finish_reason": "length" if answer.finish_reason in CUT_AT_LIMIT else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": job.input_tokens,
            "completion_tokens": job.output_tokens,
            "total_tokens": job.input_tokens + job.output_tokens,
        },
        "service_tier": "flex" if (job.options or {}).get("deferrable") else "default",
        "system_fingerprint": None,
    }
