"""Settings: the only place environment variables are read (prefix PROMPTJOBS_)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from activities.errors import BackoffPolicy


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PROMPTJOBS_", env_file=".env", extra="ignore")

    # Where the embedded stack keeps its SQLite projection and Temporal database.
    data_dir: Path = Path(".data")
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("PROMPTJOBS_DATABASE_URL", "DATABASE_URL"),
        description="SQLAlchemy URL of the projection store; default SQLite in data_dir.",
    )

    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_task_queue: str = "promptjobs"
    temporal_tls: bool = False
    temporal_ui_port: int = 8233

    api_host: str = "127.0.0.1"
    api_port: int = 8000

    # Job execution defaults (shared/DESIGN.md).
    max_attempts_default: int = Field(default=3, ge=1, le=10)
    job_ceiling_s: float = Field(default=900.0, gt=0)
    attempt_timeout_s: float = Field(default=300.0, gt=0)
    heartbeat_timeout_s: float = Field(default=10.0, gt=0)
    backoff_initial_s: float = 5.0
    backoff_coefficient: float = 5.0
    backoff_max_s: float = 600.0
    backoff_jitter: float = Field(default=0.2, ge=0, lt=1)
    rate_limit_default_s: float = 60.0

    max_prompt_bytes: int = 100_000
    worker_max_concurrent_activities: int = 1000
    dispatcher_interval_s: float = 2.0
    reconciler_interval_s: float = 30.0
    reconciler_grace_s: float = 60.0
    sse_poll_interval_s: float = 0.1
    sse_keepalive_s: float = 15.0
    shutdown_grace_s: float = 30.0

    # Providers (docs/providers.md). Credentials are never logged.
    default_provider: Literal["fake", "openai", "anthropic"] = "fake"
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None
    openai_model: str = "gpt-5.4-mini"
    openai_max_tokens: int | None = Field(default=None, ge=1)
    # OpenAI's own API wants max_completion_tokens; some compatible servers only max_tokens.
    openai_max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = (
        "max_completion_tokens"
    )
    anthropic_api_key: SecretStr | None = None
    anthropic_base_url: str | None = None
    anthropic_model: str = "claude-haiku-4-5"
    anthropic_max_tokens: int = Field(default=1024, ge=1)
    # One provider call's limit; keep it under attempt_timeout_s so it reads as `timeout`.
    provider_timeout_s: float = Field(default=120.0, gt=0)

    @property
    def projection_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'promptjobs.db').resolve()}"

    @cached_property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(
            initial_s=self.backoff_initial_s,
            coefficient=self.backoff_coefficient,
            maximum_s=self.backoff_max_s,
            jitter=self.backoff_jitter,
            rate_limit_default_s=self.rate_limit_default_s,
        )
