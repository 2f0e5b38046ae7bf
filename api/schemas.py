"""Wire shapes of the API (separate from the SQL models)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from projections.models import Job, Prompt, Response
from projections.projector import job_row
from projections.states import JobState


class SubmitPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="The prompt text")
    priority: int = Field(default=50, ge=0, le=100, description="0 is most urgent, 100 least")
    max_attempts: int | None = Field(
        default=None, ge=1, le=10, description="Attempts before the job fails; default 3"
    )
    scheduled_for: AwareDatetime | None = Field(
        default=None, description="Start the job at this time (ISO-8601 with offset)"
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="provider, model, max_tokens, temperature, system; `fake` for the fake adapter",
    )
    parent_id: str | None = Field(default=None, max_length=40)
    correlation_id: str | None = Field(default=None, max_length=128)


class JobOut(BaseModel):
    job_id: str
    prompt_id: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    error_kind: str | None
    error_message: str | None
    next_attempt_at: datetime | None
    response_id: str | None
    supersedes: str | None
    superseded_by: str | None
    scheduled_for: datetime | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls.model_validate(job_row(job))


class Accepted(BaseModel):
    prompt_id: str
    job_id: str
    state: JobState


class JobList(BaseModel):
    jobs: list[JobOut]
    next_cursor: str = Field(description="Pass as `since` to get the jobs changed after these")


class PromptOut(BaseModel):
    prompt_id: str
    prompt: str
    author: str
    options: dict[str, Any]
    parent_id: str | None
    correlation_id: str | None
    created_at: datetime
    jobs: list[JobOut] = Field(description="Every job of this prompt, oldest first")

    @classmethod
    def of(cls, prompt: Prompt, jobs: list[Job]) -> PromptOut:
        return cls(
            prompt_id=prompt.prompt_id,
            prompt=prompt.text,
            author=prompt.author,
            options=prompt.options,
            parent_id=prompt.parent_id,
            correlation_id=prompt.correlation_id,
            created_at=prompt.created_at,
            jobs=[JobOut.of(job) for job in jobs],
        )


class PromptList(BaseModel):
    prompts: list[PromptOut] = Field(description="Newest first, by when the prompt was submitted")
    next_before: str | None = Field(
        description="Pass as `before` for the next (older) page; null on the last page"
    )
    cursor: str = Field(
        description="The event cursor as of this read: pass it as `since` to `GET /v1/events` "
        "or `GET /v1/jobs` to follow every change made after it"
    )


class Usage(BaseModel):
    input_tokens: int | None
    output_tokens: int | None


class ResponseOut(BaseModel):
    response_id: str
    job_id: str
    prompt_id: str
    text: str
    provider: str
    model: str
    provider_request_id: str | None
    finish_reason: str | None
    usage: Usage
    latency_ms: int | None
    attempt: int
    created_at: datetime

    @classmethod
    def of(cls, response: Response) -> ResponseOut:
        return cls(
            response_id=response.response_id,
            job_id=response.job_id,
            prompt_id=response.prompt_id,
            text=response.text,
            provider=response.provider,
            model=response.model,
            provider_request_id=response.provider_request_id,
            finish_reason=response.finish_reason,
            usage=Usage(input_tokens=response.input_tokens, output_tokens=response.output_tokens),
            latency_ms=response.latency_ms,
            attempt=response.attempt,
            created_at=response.created_at,
        )
