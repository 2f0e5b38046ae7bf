"""`POST /v1/responses` as OpenAI's SDK sends it, and the `response` object it reads back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictStr,
    Tag,
    ValidationError,
)

from activities.adapters.base import AdapterRegistry, parse_options
from activities.adapters.json_types import NO_NUL
from activities.adapters.options import PromptOptions
from activities.adapters.structured import OutputSchema
from api.schemas import tool_calls_out
from projections.domain.errors import Refused
from projections.domain.lifecycle import ErrorKind, JobState
from projections.models import Prompt, Response
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
    before: list[dict[str, Any]] | None = None,
) -> Submission:
    """The prompt a create (or a batch's line, `in_batch`) submits, as the wire says it;
    raises UnsupportedParameter or InvalidOptions for what OpenAI's shape cannot carry here.
    `before`: the conversation `previous_response_id` continues (its request and answer),
    in the chat format. The submission's own rules (size, options against the adapters,
    budget) are the job service's (services/jobs.py)."""
    body.check_supported()
    options = body.options(adapters)
    if body.deferrable(in_batch=in_batch):
        options["deferrable"] = True
    parse_options(PromptOptions, options, "promptjobs.options")
    if isinstance(body.input, str) and before is None:
        if not body.input:
            raise UnsupportedParameter("input", "the input text is empty")
        text, messages = body.input, None
    else:
        text, messages = "", [*(before or []), *body.messages()]
    return Submission(
        text=text,
        messages=messages,
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
    image_url: StrictStr | None = None
    file_id: StrictStr | None = None
    detail: StrictStr | None = None

    def chat_part(self, where: str) -> dict[str, Any]:
        """The part in the chat format: text, or an image by URL."""
        if self.type in ("input_text", "output_text") and self.text is not None:
            return {"type": "text", "text": self.text}
        if self.type == "input_image" and self.image_url is not None:
            image: dict[str, Any] = {"url": self.image_url}
            if self.detail is not None:
                image["detail"] = self.detail
            return {"type": "image_url", "image_url": image}
        what = "an input_image by file_id" if self.type == "input_image" else repr(self.type)
        raise UnsupportedParameter(
            where,
            f"content of type {what} is not supported: send `input_text` parts (or a string) "
            "and `input_image` parts with an `image_url`",
        )


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[InputPart]

    def chat(self, where: str) -> dict[str, Any]:
        content: Any = self.content
        if not isinstance(content, str):
            content = [part.chat_part(f"{where}.content[{i}]") for i, part in enumerate(content)]
            if self.role != "user" and all(part["type"] == "text" for part in content):
                content = "".join(part["text"] for part in content)
        return {"role": self.role, "content": content}


class FunctionCallItem(BaseModel):
    """A call the model made (an earlier response's output item, sent back)."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr


class FunctionCallOutput(BaseModel):
    """A call's result, as the client ran it."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr | list[InputPart]


class OtherItem(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: StrictStr


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else "message"
    return kind if kind in ("message", "function_call", "function_call_output") else "other"


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


class FunctionTool(BaseModel):
    """A function tool in the Responses shape (flat: no `function` wrapper)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[StrictStr, Any] | None = None
    strict: StrictBool | None = None

    def chat(self) -> dict[str, Any]:
        function = self.model_dump(exclude={"type"}, exclude_none=True)
        return {"type": "function", "function": function}


class OtherTool(BaseModel):
    """A built-in tool of OpenAI's (web search, file search…): refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: StrictStr


def _tool_kind(value: Any) -> str:
    return "function" if isinstance(value, dict) and value.get("type") == "function" else "other"


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[OtherTool, Tag("other")],
    Discriminator(_tool_kind),
]


class NamedTool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    name: StrictStr


class PromptjobsExtras(BaseModel):
    """`promptjobs` in the body (the SDK's `extra_body`): what OpenAI has no parameter for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    priority: Annotated[int, Field(ge=0, le=100)] = 50
    max_attempts: Annotated[int, Field(ge=1, le=10)] | None = None
    options: dict[str, Any] = Field(
        default_factory=dict,
        description='Provider options as `POST /v1/prompts` takes them, e.g. `{"fake": {…}}`',
    )

    def options_for(self, adapters: AdapterRegistry, model: str) -> dict[str, Any]:
        """The job's options before a request's own parameters: these, with the provider and
        model OpenAI's `model` names (`provider/model`, a route the operator named, or a
        model of the default provider)."""
        options = dict(self.options)
        if model in adapters.routes:
            options["route"] = model  # a route the operator named wins over a bare model name
            return options
        provider, named = adapters.split_model(model)
        if provider is not None:
            options["provider"] = provider
        options["model"] = named
        return options


class CreateResponse(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: StrictStr = Field(min_length=1, max_length=200, pattern=NO_NUL)
    input: StrictStr | list[InputItem]
    instructions: StrictStr | None = Field(default=None, pattern=NO_NUL)
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: StrictBool | None = None
    previous_response_id: StrictStr | None = Field(default=None, max_length=64)
    metadata: dict[StrictStr, StrictStr] | None = None
    background: StrictBool | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    text: dict[StrictStr, Any] | None = None
    promptjobs: PromptjobsExtras = Field(default_factory=PromptjobsExtras)

    def deferrable(self, *, in_batch: bool) -> bool:
        """`service_tier: "flex"` asks for the slower, cheaper tier: a background response or
        a batch's line runs as a deferrable job, in a provider batch where its provider has
        one (docs/openai.md); a response its caller waits or streams for runs directly."""
        return self.service_tier == "flex" and (in_batch or bool(self.background))

    def check_supported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if name in IGNORED or value is None:
                continue
            raise UnsupportedParameter(
                name, f"`{name}` is not supported by promptjobs: leave it out (see docs/openai.md)"
            )
        if self.store is False:
            raise UnsupportedParameter(
                "store", "promptjobs keeps every response (it is a job): leave `store` out"
            )
        for i, tool in enumerate(self.tools or ()):
            if isinstance(tool, OtherTool):
                raise UnsupportedParameter(
                    "tools",
                    f"tools[{i}]: tools of type {tool.type!r} are not supported by promptjobs; "
                    "function tools are",
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

    def messages(self) -> list[dict[str, Any]]:
        """The input as a conversation in the chat format: message items as messages, a
        `function_call` as an assistant message's tool call (calls in a row, one message),
        a `function_call_output` as a tool message."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        messages: list[dict[str, Any]] = []
        for i, item in enumerate(self.input):
            where = f"input[{i}]"
            if isinstance(item, InputMessage):
                messages.append(item.chat(where))
            elif isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutput):
                output = item.output
                if not isinstance(output, str):
                    parts = [p.chat_part(f"{where}.output[{j}]") for j, p in enumerate(output)]
                    output = "".join(str(p.get("text", "")) for p in parts)
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
            else:
                raise UnsupportedParameter(
                    where,
                    f"input items of type {item.type!r} are not supported: send messages, "
                    "`function_call` and `function_call_output` items",
                )
        return messages

    def options(self, adapters: AdapterRegistry) -> dict[str, Any]:
        """The job's options: `promptjobs.options`, then the OpenAI parameters over them."""
        options = self.promptjobs.options_for(adapters, self.model)
        for key, value in (
            ("system", self.instructions),
            ("max_tokens", self.max_output_tokens),
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("parallel_tool_calls", self.parallel_tool_calls),
        ):
            if value is not None:
                options[key] = value
        text = self.text or {}
        for key in text:
            if key not in ("format", "verbosity"):
                raise UnsupportedParameter(
                    f"text.{key}", f"`text.{key}` is not supported by promptjobs: leave it out"
                )
        wanted = output_schema_of("text.format", text.get("format"), flat=True)
        if wanted is not None:
            options["output_schema"] = wanted
        if self.tools:
            options["tools"] = [t.chat() for t in self.tools if isinstance(t, FunctionTool)]
        if isinstance(self.tool_choice, NamedTool):
            options["tool_choice"] = {
                "type": "function",
                "function": {"name": self.tool_choice.name},
            }
        elif self.tool_choice is not None and (self.tools or self.tool_choice != "auto"):
            options["tool_choice"] = self.tool_choice
        return options

    def kept(self) -> dict[str, Any]:
        """Prompt.openai: what the response object echoes that options do not hold."""
        return {
            "model": self.model,
            "metadata": self.metadata or {},
            "background": bool(self.background),
            "instructions": self.instructions,
            "previous_response_id": self.previous_response_id,
        }


def output_schema_of(param: str, given: Any, *, flat: bool) -> dict[str, Any] | None:
    """OpenAI's answer format as `options.output_schema` (None: text): Chat Completions'
    `response_format` (`{"type": "json_schema", "json_schema": {name, schema, strict}}`) or
    Responses' `text.format` (`flat`: the same fields beside `type`); `json_object` either
    way. Raises UnsupportedParameter naming what is wrong with it."""
    if given is None:
        return None
    kind = given.get("type") if isinstance(given, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        wanted: dict[str, Any] = {}  # no schema: any JSON object
    elif kind == "json_schema":
        fields = (
            {k: v for k, v in given.items() if k != "type"} if flat else given.get("json_schema")
        )
        if not isinstance(fields, dict):
            raise UnsupportedParameter(
                param, f"`{param}` of type json_schema needs `json_schema`", code="invalid_value"
            )
        wanted = {k: v for k, v in fields.items() if v is not None}
        if "schema" not in wanted:
            raise UnsupportedParameter(
                param, f"`{param}` of type json_schema needs `schema`", code="invalid_value"
            )
    else:
        raise UnsupportedParameter(
            param,
            f"`{param}.type` must be `text`, `json_object` or `json_schema`",
            code="invalid_value",
        )
    try:
        OutputSchema.model_validate(wanted)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join([param, *(str(p) for p in first["loc"])])
        raise UnsupportedParameter(
            param, f"{where}: {first['msg'].removeprefix('Value error, ')}", code="invalid_value"
        ) from err
    return wanted


def text_format(output_schema: dict[str, Any] | None) -> dict[str, Any]:
    """A job's output schema as Responses' `text.format` says it."""
    if output_schema is None:
        return {"type": "text"}
    if output_schema.get("schema") is None:
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "name": output_schema.get("name", "output"),
        "schema": output_schema.get("schema"),
        "strict": output_schema.get("strict"),
        "description": output_schema.get("description"),
    }


def answered_object(prompt: Prompt, job: JobLike, answer: Response) -> dict[str, Any]:
    """The `response` object of a prompt whose current job is `job`, with its answer."""
    return response_object(
        prompt,
        job,
        text=answer.text,
        finish_reason=answer.finish_reason,
        model=answer.model,
        tool_calls=answer.tool_calls,
    )


def continued(prompt: Prompt, answer: Response) -> list[dict[str, Any]]:
    """The conversation a response continuing `prompt` starts with (`previous_response_id`):
    that prompt's messages (its text as one user message, for a prompt of text) and its
    answer, as an assistant message with any tool calls it made."""
    before = list(prompt.messages or [{"role": "user", "content": prompt.text}])
    said: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
    if calls := tool_calls_out(answer.tool_calls):
        said["tool_calls"] = [call.model_dump(mode="json") for call in calls]
    elif said["content"] is None:
        said["content"] = ""
    return [*before, said]


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


def function_call_item(
    job_id: str, attempt: int, index: int, call: dict[str, str]
) -> dict[str, Any]:
    """A tool call of an answer as a Responses output item."""
    return {
        "type": "function_call",
        "id": f"fc_{job_id.removeprefix('job_')}_{attempt}_{index}",
        "call_id": call["id"],
        "name": call["name"],
        "arguments": call["arguments"],
        "status": "completed",
    }


def responses_tool_choice(choice: Any) -> Any:
    """A job's tool_choice as the Responses API says it (a function named flat)."""
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return choice or "auto"


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
    tool_calls: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The `response` object of a prompt whose current job is `job` (`text`: its answer, once
    it has one, and the tool calls it made)."""
    kept = prompt.openai or {}
    options = job.options if job.options is not None else prompt.options
    status = status_of(job, finish_reason)
    output: list[dict[str, Any]] = []
    if text is not None and (text or not tool_calls):
        output.append(
            {
                "type": "message",
                "id": message_id(job.job_id, job.attempt),
                "status": "incomplete" if status == "incomplete" else "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    output.extend(
        function_call_item(job.job_id, job.attempt, i, call)
        for i, call in enumerate(tool_calls or ())
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
        "parallel_tool_calls": (options or {}).get("parallel_tool_calls", True),
        "previous_response_id": kept.get("previous_response_id"),
        "reasoning": None,
        "service_tier": "flex" if (options or {}).get("deferrable") else "default",
        "store": True,
        "temperature": (options or {}).get("temperature"),
        "text": {"format": text_format((options or {}).get("output_schema"))},
        "tool_choice": responses_tool_choice((options or {}).get("tool_choice")),
        "tools": [
            {"type": "function", "strict": None, **tool["function"]}
            for tool in (options or {}).get("tools") or ()
        ],
        "top_p": (options or {}).get("top_p"),
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
