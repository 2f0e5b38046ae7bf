"""`POST /v1/responses` as OpenAI's SDK sends it, and the `response` object it reads back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from activities.adapters.base import AdapterRegistry, parse_options
from activities.adapters.json_types import NO_NUL
from activities.adapters.options import PromptOptions
from projections.domain.errors import Refused
from projections.domain.lifecycle import ErrorKind, JobState
from projections.models import Prompt
from projections.writes import Submission

# OpenAI's bounds on `metadata`: 16 pairs, keys of 64 characters, values of 512.
METADATA_PAIRS = 16
RESPONSE_PREFIX = "resp_"
PROMPT_PREFIX = "pmt_"
# Finish reasons that mean the answer was cut at its token limit (OpenAI's, Anthropic's).
CUT_AT_LIMIT = frozenset({"length", "max_tokens"})

# Parameters the SDK may send that change nothing here: accepted and not kept.
IGNORED = frozenset(
    {
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "truncation",
        "include",
        "stream_options",
    }
)
# ... and the tool settings that mean "no tools".
NO_TOOLS = {"tool_choice": ("none", "auto"), "parallel_tool_calls": (False, True)}


class UnsupportedParameter(Refused):
    """A parameter promptjobs cannot honour: a 400 naming it, never silently dropped (or
    another refusal of one parameter, with its own code)."""

    code = "unsupported_parameter"

    def __init__(self, param: str, message: str, *, code: str = "unsupported_parameter") -> None:
        super().__init__(message)
        self.param = param
        self.message = message
        self.code = code


def submission_of(
    body: CreateResponse,
    adapters: AdapterRegistry,
    *,
    idempotency_key: str | None = None,
    in_batch: bool = False,
) -> Submission:
    """The prompt a create (or a batch's line, `in_batch`) submits, as the wire says it;
    raises UnsupportedParameter or InvalidOptions for what OpenAI's shape cannot carry here.
    The submission's own rules (size, options against the adapters, budget) are the job
    service's (services/jobs.py)."""
    body.check_supported()
    text, system = body.prompt_and_system()
    options = body.options(adapters, system)
    if body.deferrable(in_batch=in_batch):
        options["deferrable"] = True
    parse_options(PromptOptions, options, "promptjobs.options")
    return Submission(
        text=text,
        priority=body.promptjobs.priority,
        max_attempts=body.promptjobs.max_attempts,
        options=options,
        idempotency_key=idempotency_key,
        openai=body.kept(),
    )


class InputPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: StrictStr
    text: StrictStr | None = None


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[InputPart]

    def text(self, where: str) -> str:
        if isinstance(self.content, str):
            return self.content
        texts = []
        for i, part in enumerate(self.content):
            if part.type not in ("input_text", "output_text") or part.text is None:
                raise UnsupportedParameter(
                    f"{where}.content[{i}]",
                    f"content of type {part.type!r} is not supported: send text "
                    "(`input_text` parts or a string)",
                )
            texts.append(part.text)
        return "".join(texts)


class PromptjobsExtras(BaseModel):
    """`promptjobs` in the body (the SDK's `extra_body`): what OpenAI has no parameter for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    priority: Annotated[int, Field(ge=0, le=100)] = 50
    max_attempts: Annotated[int, Field(ge=1, le=10)] | None = None
    options: dict[str, Any] = Field(
        default_factory=dict,
        description='Provider options as `POST /v1/prompts` takes them, e.g. `{"fake": {…}}`',
    )


class CreateResponse(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: StrictStr = Field(min_length=1, max_length=200, pattern=NO_NUL)
    input: StrictStr | list[InputMessage]
    instructions: StrictStr | None = Field(default=None, pattern=NO_NUL)
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    background: StrictBool | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    promptjobs: PromptjobsExtras = Field(default_factory=PromptjobsExtras)

    def deferrable(self, *, in_batch: bool) -> bool:
        """`service_tier: "flex"` asks for the slower, cheaper tier: a background response or
        a batch's line runs as a deferrable job, in a provider batch where its provider has
        one (docs/openai.md); a response its caller waits or streams for runs directly."""
        return self.service_tier == "flex" and (in_batch or bool(self.background))

    def check_supported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if name in IGNORED or value is None or value in NO_TOOLS.get(name, ()):
                continue
            raise UnsupportedParameter(
                name, f"`{name}` is not supported by promptjobs: leave it out (see docs/openai.md)"
            )
        if self.store is False:
            raise UnsupportedParameter(
                "store", "promptjobs keeps every response (it is a job): leave `store` out"
            )
        if self.metadata is not None:
            if len(self.metadata) > METADATA_PAIRS:
                raise UnsupportedParameter("metadata", "metadata holds at most 16 pairs")
            for key, value in self.metadata.items():
                if len(key) > 64 or len(value) > 512:
                    raise UnsupportedParameter(
                        "metadata",
                        "metadata keys are at most 64 characters and values at most 512",
                    )

    def prompt_and_system(self) -> tuple[str, str | None]:
        """The prompt text and the system text (`instructions`, then system or developer
        messages). One user message is the prompt; a conversation is not supported."""
        system = [self.instructions] if self.instructions else []
        if isinstance(self.input, str):
            prompt = self.input
        else:
            users: list[str] = []
            for i, item in enumerate(self.input):
                if item.role == "assistant":
                    raise UnsupportedParameter(
                        f"input[{i}]",
                        "assistant messages (a conversation) are not supported: send the "
                        "exchange as one user message",
                    )
                text = item.text(f"input[{i}]")
                (users if item.role == "user" else system).append(text)
            if len(users) != 1:
                raise UnsupportedParameter(
                    "input",
                    f"input has {len(users)} user messages; promptjobs runs exactly one "
                    "(with any system or developer messages)",
                )
            prompt = users[0]
        if not prompt:
            raise UnsupportedParameter("input", "the input text is empty")
        return prompt, "\n\n".join(system) if system else None

    def options(self, adapters: AdapterRegistry, system: str | None) -> dict[str, Any]:
        """The job's options: `promptjobs.options`, then the OpenAI parameters over them."""
        options = dict(self.promptjobs.options)
        provider, model = adapters.split_model(self.model)
        if provider is not None:
            options["provider"] = provider
        options["model"] = model
        for key, value in (
            ("system", system),
            ("max_tokens", self.max_output_tokens),
            ("temperature", self.temperature),
        ):
            if value is not None:
                options[key] = value
        return options

    def kept(self) -> dict[str, Any]:
        """Prompt.openai: what the response object echoes that options do not hold."""
        return {
            "model": self.model,
            "metadata": self.metadata or {},
            "background": bool(self.background),
            "instructions": self.instructions,
        }


def response_id(prompt_id: str) -> str:
    return RESPONSE_PREFIX + prompt_id.removeprefix(PROMPT_PREFIX)


def prompt_id_of(response_id: str) -> str:
    """The prompt behind a response id; one that is not a response's names no prompt."""
    if not response_id.startswith(RESPONSE_PREFIX):
        return response_id  # not found as a prompt either, so a 404 like any unknown id
    return PROMPT_PREFIX + response_id.removeprefix(RESPONSE_PREFIX)


class JobLike(Protocol):
    """A job as its row or one of its events has it."""

    job_id: str
    state: JobState
    attempt: int
    options: dict[str, Any] | None
    error_kind: ErrorKind | None
    error_message: str | None
    input_tokens: int
    output_tokens: int
    response_id: str | None


def message_id(job_id: str, attempt: int) -> str:
    """The id of the message item an attempt's text is (api/openai/stream.py)."""
    return f"msg_{job_id.removeprefix('job_')}_{attempt}"


def status_of(job: JobLike, finish_reason: str | None) -> str:
    if job.state == JobState.QUEUED:
        # A job waiting to retry has been worked on: OpenAI's `in_progress`.
        return "queued" if job.attempt == 0 else "in_progress"
    if job.state == JobState.RUNNING:
        return "in_progress"
    if job.state == JobState.SUCCEEDED:
        return "incomplete" if finish_reason in CUT_AT_LIMIT else "completed"
    if job.state == JobState.FAILED:
        return "failed"
    return "cancelled"  # cancelled, or (never the current job) superseded


# OpenAI's `error.code` for each of our error kinds.
ERROR_CODES: Mapping[str, str] = {
    "rate_limit": "rate_limit_exceeded",
    "provider_4xx": "invalid_prompt",
    "auth": "server_error",
}


def response_object(
    prompt: Prompt,
    job: JobLike,
    *,
    text: str | None = None,
    finish_reason: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """The `response` object of a prompt whose current job is `job` (`text`: its answer, once
    it has one)."""
    kept = prompt.openai or {}
    options = job.options if job.options is not None else prompt.options
    status = status_of(job, finish_reason)
    output: list[dict[str, Any]] = []
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": message_id(job.job_id, job.attempt),
                "status": "incomplete" if status == "incomplete" else "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    error = None
    if status == "failed":
        kind = job.error_kind.value if job.error_kind else "unknown"
        error = {
            "code": ERROR_CODES.get(kind, "server_error"),
            "message": f"{kind}: {job.error_message or 'the job failed'}",
        }
    settled = job.state.is_terminal
    return {
        "id": response_id(prompt.prompt_id),
        "object": "response",
        "created_at": int(prompt.created_at.timestamp()),
        "status": status,
        "background": bool(kept.get("background")),
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": kept.get("instructions"),
        "max_output_tokens": (options or {}).get("max_tokens"),
        "metadata": kept.get("metadata", {}),
        "model": kept.get("model") or model or (options or {}).get("model") or "",
        "output": output,
        "parallel_tool_calls": False,
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "flex" if (options or {}).get("deferrable") else "default",
        "store": True,
        "temperature": (options or {}).get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": "none",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "usage": {
            "input_tokens": job.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": job.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": job.input_tokens + job.output_tokens,
        }
        if settled or job.input_tokens or job.output_tokens
        else None,
        "user": None,
        "promptjobs": {"job_id": job.job_id, "prompt_id": prompt.prompt_id, "state": job.state},
    }
