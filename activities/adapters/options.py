"""A job's `options`: the one model the API validates a submission with and the adapters run
the job by. Typed as JSON is (a stored job's options are the JSON its client sent)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, Strict, ValidationError, model_validator

from activities.adapters.conversation import MAX_TOOLS, Tool, ToolChoice, check_tools
from activities.adapters.json_types import JSON_INTEGER, NO_NUL, STRICT_BODY
from activities.adapters.structured import OutputSchema
from projections.domain.lifecycle import ErrorKind
from projections.models import Job, Prompt, job_options

StopText = Annotated[str, Field(min_length=1, max_length=1_000, pattern=NO_NUL)]


class FakeOptions(BaseModel):
    """`options.fake`: attempt i fails with `fail[i-1]` while i <= len(fail), then succeeds;
    the answer of the j-th attempt that succeeds is `answers[j-1]` while j <= len(answers)."""

    model_config = STRICT_BODY

    latency_ms: Annotated[int, Field(ge=0, le=3_600_000), *JSON_INTEGER] = 0
    fail: list[Annotated[ErrorKind, Strict(False)]] = Field(
        default_factory=list, max_length=20, description="Error kinds of the first attempts"
    )
    retry_after_s: float | None = Field(default=None, ge=0, le=86_400)
    answers: list[Annotated[str, Field(max_length=100_000)]] = Field(
        default_factory=list,
        max_length=20,
        description="Scripted answers of the first successful calls (e.g. JSON that does or "
        "does not match the output schema); then the usual answer",
    )


# How many other places a job may name to run in (`options.fallbacks`).
MAX_FALLBACKS = 4


class Fallback(BaseModel):
    """Another place a job may run: a provider of this deployment, and a model of it."""

    model_config = STRICT_BODY

    provider: str = Field(min_length=1, max_length=32, pattern=NO_NUL)
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=NO_NUL,
        description="Default: the provider's default model",
    )


class PromptOptions(BaseModel):
    """How to run the prompt. `provider` is one of this deployment's providers."""

    model_config = STRICT_BODY

    provider: str | None = Field(default=None, description="Default: the server's provider")
    # The responses table holds 128 characters of model name.
    model: str | None = Field(default=None, min_length=1, max_length=128, pattern=NO_NUL)
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000), *JSON_INTEGER] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1), *JSON_INTEGER] | None = None
    stop: StopText | Annotated[list[StopText], Field(min_length=1, max_length=4)] | None = Field(
        default=None, description="Stop at this text (or at any of up to 4)"
    )
    system: str | None = Field(default=None, max_length=100_000, pattern=NO_NUL)
    tools: list[Tool] | None = Field(
        default=None, max_length=MAX_TOOLS, description="Functions the model may call"
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description="`auto` (the default with tools), `none`, `required`, or "
        '{"type": "function", "function": {"name": …}}',
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="Whether the model may ask for several calls at once"
    )
    output_schema: OutputSchema | None = Field(
        default=None,
        description="The answer must be JSON matching this schema: validated on every "
        "answer; a miss (`schema_mismatch`) runs again with a repair turn",
    )
    route: str | None = Field(
        default=None,
        max_length=64,
        pattern=NO_NUL,
        description="A route the operator named (`GET /v1/models` lists them): the job runs "
        "at its first place with the others as its fallbacks. Without `provider`, `model` "
        "and `fallbacks`, which the route names",
    )
    fallbacks: list[Fallback] | None = Field(
        default=None,
        max_length=MAX_FALLBACKS,
        description="Where else the job may run, in order: when its provider is out (it "
        "failed twice in a row with provider_5xx or timeout), or says the model is gone or "
        "the request is over its context window, the next attempt runs on the next of "
        "these (the whole request unchanged), and after the last on the first again",
    )
    fallback_after_s: float | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="How long the job waits for room in its place's provider budget before "
        "it starts at its next place instead (spending no attempt); default: the "
        "server's (PROMPTJOBS_FALLBACK_AFTER_S)",
    )
    fake: FakeOptions | None = Field(default=None, description="Behaviour of the fake provider")
    deferrable: bool | None = Field(
        default=None,
        description="The job may run in its provider's batch API, within 24 hours, at the "
        "batch price (about half); it stays queued until its batch runs it. A provider "
        "without a batch API runs it directly",
    )

    @model_validator(mode="after")
    def _tools_agree(self) -> PromptOptions:
        check_tools(self.tools or (), self.tool_choice)
        return self


def targets(options: PromptOptions) -> list[PromptOptions]:
    """Every place the job may run, in order: its own provider and model, then its
    fallbacks', each as the options an attempt there runs with."""
    return [options] + [
        options.model_copy(update={"provider": f.provider, "model": f.model})
        for f in options.fallbacks or ()
    ]


def on_target(options: PromptOptions, index: int) -> PromptOptions:
    """The options of the job's `index`-th place (0: its own), going round past the last."""
    if not options.fallbacks or index == 0:
        return options
    return targets(options)[index % (len(options.fallbacks) + 1)]


def options_of(job: Job, prompt: Prompt) -> tuple[PromptOptions, str | None]:
    """The options a job runs with, as their model, parsed once from its stored JSON (which
    passed the same model at submission; a row from before migration 0004 has none of its
    own, and ran with its prompt's), and None; or, for stored options this version no longer
    takes, their provider and model alone and why the rest cannot run (the job's call then
    fails as `provider_4xx`, saying so)."""
    stored = job_options(job, prompt)
    try:
        return on_target(PromptOptions.model_validate(stored), job.fallback or 0), None
    except ValidationError as err:
        provider, model = stored.get("provider"), stored.get("model")
        why = "; ".join(
            ".".join(["options", *(str(p) for p in e["loc"])]) + f": {e['msg']}"
            for e in err.errors()
        )
        return PromptOptions.model_construct(
            provider=provider if isinstance(provider, str) else None,
            model=model if isinstance(model, str) and model else None,
        ), why
