"""Settings: the only place environment variables are read (prefix PROMPTJOBS_).

Every field carries a docstring: docs/configuration.md is generated from them
(`python -m promptjobs.settings_doc --write`) and a test keeps the two in step.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from projections.domain.lifecycle import BackoffPolicy


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PROMPTJOBS_",
        env_file=".env",
        extra="ignore",
        use_attribute_docstrings=True,
    )

    data_dir: Path = Path(".data")
    """Where the embedded stack keeps its SQLite projection, Temporal database and dev key."""
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("PROMPTJOBS_DATABASE_URL", "DATABASE_URL"),
        description=(
            "SQLAlchemy URL of the projection store, e.g. "
            "`postgresql://user:pass@host:5432/promptjobs`; default: SQLite in the data dir."
        ),
    )
    database_pool_size: int = Field(default=10, ge=1)
    """Connections each process keeps open to the projection store (as many again may
    overflow); on SQLite, for reads only, each with a thread of its own."""
    sqlite_busy_timeout_s: float = Field(default=30.0, gt=0)
    """How long a SQLite write waits for another writer's lock before the database counts as
    unavailable (the API answers `503`; a job's attempt waits and tries again)."""

    temporal_address: str = "127.0.0.1:7233"
    """Temporal frontend `host:port`."""
    temporal_namespace: str = "default"
    """Temporal namespace the jobs' workflows live in."""
    temporal_task_queue: str = "promptjobs"
    """Task queue the API starts workflows on and the workers poll; the same on both."""
    temporal_tls: bool = False
    """Connect to Temporal over TLS (implied by any other `..._TLS_...` setting or an API key)."""
    temporal_tls_cert_path: Path | None = None
    """PEM client certificate for mutual TLS (Temporal Cloud mTLS, or a self-hosted mTLS)."""
    temporal_tls_key_path: Path | None = None
    """PEM private key of the client certificate (set both or neither)."""
    temporal_tls_ca_path: Path | None = None
    """PEM root CA to verify the server with; default: the system's roots."""
    temporal_tls_server_name: str | None = None
    """TLS server name (SNI) to verify, when it differs from the address's host."""
    temporal_api_key: SecretStr | None = None
    """Temporal Cloud API key, sent as a bearer token (turns TLS on)."""
    temporal_ui_port: int = 8233
    """Port of the Temporal Web UI that `promptjobs dev` starts."""
    temporal_dev_nice: int = Field(default=10, ge=0, le=19)
    """The niceness `promptjobs dev` runs its Temporal server at (Linux): on a small machine a
    burst of workflow starts then yields the cores to the API's requests instead of queueing
    them (c=32 submit p99 about halved on 2 cores: bench/README.md); the starts catch up as
    soon as the cores are free. 0: the same priority as the API."""

    api_host: str = "127.0.0.1"
    """Address the API listens on (`0.0.0.0` in a container)."""
    api_port: int = 8000
    """Port the API listens on."""

    # Job execution defaults (docs/api.md, docs/providers.md).
    max_attempts_default: int = Field(default=3, ge=1, le=10)
    """Attempts a job gets when its submission does not say."""
    job_ceiling_s: float = Field(default=900.0, gt=0)
    """Hard ceiling of one job, all attempts and waits included; past it the job is `stuck`."""
    deferrable_ceiling_s: float = Field(default=90_000.0, gt=0)
    """Hard ceiling of a deferrable job (`options.deferrable`): its provider batch may take
    the provider's 24 hours, then it may still run directly."""
    batch_max_jobs: int = Field(default=1000, ge=1, le=50_000)
    """Deferrable jobs of one provider and model sent as one provider batch at most; a full
    batch is sent at once."""
    batch_max_wait_s: float = Field(default=300.0, ge=0)
    """How long the oldest deferrable job waits for others to join its provider batch."""
    batch_poll_s: float = Field(default=60.0, gt=0)
    """How often a provider batch's status is asked for while the provider runs it."""
    attempt_timeout_s: float = Field(default=300.0, gt=0)
    """Limit of one adapter call (one attempt); past it the attempt fails with `timeout`."""
    heartbeat_timeout_s: float = Field(default=10.0, gt=0)
    """A worker silent this long is presumed dead and its attempt runs elsewhere."""
    backoff_initial_s: float = 5.0
    """First retry delay of exponential backoff (`timeout`, `provider_5xx`, `unknown`)."""
    backoff_coefficient: float = 5.0
    """Growth factor of exponential backoff between attempts."""
    backoff_max_s: float = 600.0
    """Longest exponential backoff delay."""
    backoff_jitter: float = Field(default=0.2, ge=0, lt=1)
    """Relative jitter on backoff delays (0.2 = ±20 %)."""
    rate_limit_default_s: float = 60.0
    """Delay after a `rate_limit` when the provider sent no `Retry-After`."""

    budget_window_s: float = Field(default=60.0, gt=0, le=3600)
    """The window, in seconds, a provider budget's limits count over: OpenAI's and
    Anthropic's are per minute (60). A budget's `rpm` and `tpm` (`promptjobs budgets set`)
    are requests and tokens per this window; every process of a deployment sets the same."""

    max_jobs_per_prompt: int = Field(default=50, ge=1)
    """Jobs one prompt may have, retries included: a retry past it is a `409 retry_limit`
    (submit the prompt again as a new one). Keeps every read of a prompt bounded."""
    max_prompt_bytes: int = 100_000
    """Largest prompt the API accepts, in UTF-8 bytes (with `options.system`, which goes to
    the provider with it); a conversation's is its transcript's (its messages' text and tool
    calls), its images apart."""
    max_image_bytes: int = Field(default=10_000_000, ge=0)
    """The images one request may give inline (base64 data URLs), in bytes all told; an image
    given by https:// URL is the provider's to fetch and counts nothing. 0: none inline."""
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1)
    """Largest file `POST /v1/files` accepts (a batch's input file), in bytes."""
    org_max_file_bytes: int = Field(default=5 * 1024**3, ge=1)
    """The files one org may keep at once, in bytes all told: an upload past it is refused
    (413) until files are deleted, or retention removes them (`PROMPTJOBS_RETENTION_DAYS`)."""
    batch_max_lines: int = Field(default=50_000, ge=1)
    """Lines a `/v1/batches` input file may have (OpenAI's limit): a longer one fails the
    batch's validation, and no job is made."""
    worker_max_concurrent_activities: int = Field(default=1000, ge=1)
    """Activities (adapter calls and projection writes) one worker runs at once."""
    worker_max_concurrent_workflow_tasks: int = Field(default=100, ge=2)
    """Workflow tasks one worker runs at once."""
    worker_workflow_sandbox: Literal["shared", "strict"] = "shared"
    """How Temporal's sandbox loads our workflow modules. `shared`: once per worker, shared
    by every workflow run (their code holds no state between runs); the sandbox still
    restricts builtins and what workflow code imports as it runs, but not the calls a module
    makes through its own imports (`datetime.now()` would run unnoticed). `strict`: afresh
    for every run, every check on; the test suite runs so, and it costs a worker ~4 ms of
    CPU per job (docs/decisions.md)."""
    worker_report_running_after_s: float = Field(default=5.0, ge=0)
    """How long an attempt runs before it shows as running in its workflow's search attributes
    (the Web UI's lists). Each report is a signal, a workflow task and an upsert per job,
    about as much of Temporal's work as the rest of a quick job; the API shows running at
    once, the Web UI's pending activity too."""
    dispatcher_interval_s: float = 2.0
    """How often the API's dispatcher scans for jobs whose workflow is not started yet."""
    dispatcher_max_starts: int = Field(default=64, ge=1)
    """Workflow starts an API process has on their way to Temporal at once. A burst of
    submits faster than Temporal starts workflows waits in the process, most urgent first
    (the jobs are accepted and `queued` meanwhile); more at once only makes every start
    slower and the API's memory larger."""
    reconciler_interval_s: float = 30.0
    """How often the reconciler compares unsettled rows with their workflows."""
    reconciler_grace_s: float = 60.0
    """How long a row may go unchanged before the reconciler looks at its workflow."""
    api_key_cache_ttl_s: float = Field(default=5.0, ge=0)
    """How long an API process trusts an API key it has verified before it looks the key up
    again: a revoked key (`promptjobs keys revoke`) stops working within this time. 0 looks
    the key up on every request."""
    sse_poll_interval_s: float = 0.02
    """The one reader of the event log per API process looks for new events this often
    while streams are open, to notice commits of other processes (SQLite; a safety net on
    PostgreSQL, where LISTEN/NOTIFY wakes it). Commits of its own process wake it at once."""
    sse_keepalive_s: float = 15.0
    """Interval of SSE keep-alive comments on an idle stream."""
    sse_max_streams: int = Field(default=2000, ge=1)
    """Open `GET /v1/events` streams one API process serves; past it a new stream is a `429`
    with `Retry-After` (another API process behind the load balancer may have room)."""
    sse_max_streams_per_key: int = Field(default=50, ge=1)
    """Open streams one API key may hold on one API process; past it a new one is a `429`."""
    sse_max_lifetime_s: float = Field(default=3600.0, gt=0)
    """A stream ends cleanly after this long (less up to 10 %, so streams opened together do
    not all reconnect together); the client reconnects with `Last-Event-ID` and misses
    nothing. Bounds how long a connection holds a slot and an authorisation."""
    sse_buffer_events: int = Field(default=1000, ge=1)
    """Events queued for one stream whose client reads slower than they come; past it the
    stream is ended cleanly and the client resumes from the log with `Last-Event-ID`."""
    sse_key_check_s: float = Field(default=5.0, gt=0)
    """How often open streams' API keys are checked (one query for all of them): a revoked
    key's streams end within this long."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM: how long a worker lets in-flight calls finish (then they are retried
    elsewhere), and how long the API lets in-flight requests finish."""

    # Providers (docs/providers.md). Credentials are never logged.
    org_max_running: int = Field(default=100, ge=0)
    """Jobs one org may have running at once, across every worker: a job takes a slot when its
    first attempt starts and holds it until it settles (waits between attempts included).
    More wait `queued`, in priority order, and start as slots free up (the dispatcher wakes
    them every `PROMPTJOBS_DISPATCHER_INTERVAL_S`). 0: no limit. An org's own limit, set
    with `promptjobs orgs limit ORG N`, takes its place; workers and API read the same."""
    priority_aging_s: float = Field(default=5.0, gt=0)
    """When provider capacity is short (a provider budget, `promptjobs budgets`), jobs wait
    in priority order, and a waiting job's priority improves by one for every this many
    seconds it waits: a priority-90 job goes before fresh priority-10 work after
    80 times this (400 s by default), so no job starves under a steady urgent load."""
    max_provider_budgets: int = Field(default=1000, ge=1)
    """Provider budgets the fleet keeps at most (`promptjobs budgets list`). A budget is made
    by the first call on a provider and model, to learn its limits; at this many, a call on
    a model without one runs without a budget (a 429 still pauses it). A first call the
    provider refuses as a client error (an unknown model, say) leaves no budget behind."""
    fake_adapter: bool = False
    """Offer the `fake` provider (deterministic output; `options.fake` injects latency and
    failures). On in `promptjobs dev` and the tests; off by default for `promptjobs api` and
    `promptjobs worker`, where any member could otherwise hold worker slots for a job's whole
    ceiling. Off, a submission naming it is a `422`."""
    default_provider: Literal["fake", "openai", "anthropic"] | None = None
    """Provider of a job whose options name none. Unset: `fake` where the fake provider is on,
    else `openai` unless only `anthropic` has a key."""
    openai_api_key: SecretStr | None = None
    """API key of the OpenAI-compatible provider."""
    openai_base_url: str | None = None
    """Base URL of the OpenAI-compatible provider; default: OpenAI's."""
    openai_model: str = "gpt-5.4-mini"
    """Model of an `openai` job whose options name none."""
    openai_max_tokens: int | None = Field(default=None, ge=1)
    """Output token limit of an `openai` job whose options set none; unset sends no limit."""
    openai_max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = (
        "max_completion_tokens"
    )
    """Request field for the token limit: OpenAI's own API wants `max_completion_tokens`, some
    compatible servers only `max_tokens`."""
    anthropic_api_key: SecretStr | None = None
    """API key of the Anthropic provider."""
    anthropic_base_url: str | None = None
    """Base URL of the Anthropic provider; default: Anthropic's."""
    anthropic_model: str = "claude-haiku-4-5"
    """Model of an `anthropic` job whose options name none."""
    anthropic_max_tokens: int = Field(default=1024, ge=1)
    """Output token limit of an `anthropic` job whose options set none (the API needs one)."""
    provider_timeout_s: float = Field(default=120.0, gt=0)
    """Limit of one provider call; keep it under attempt_timeout_s so it reads as `timeout`."""
    output_flush_ms: float = Field(default=100.0, ge=0)
    """A streaming job's text is written to the projection (a `job.output` event) at most
    this often per job: the first text after a quiet spell at once, the rest in batches.
    One transaction carries the batches of every job of the worker."""
    output_flush_chars: int = Field(default=4096, ge=1)
    """...or as soon as this many characters of one job are waiting, whichever comes first."""
    cancel_watch_s: float = Field(default=0.25, gt=0)
    """How often a worker reads the rows of the jobs it is calling providers for (one query
    for all of them): a cancelled job's provider call is closed within this long of the
    cancel reaching the row, without waiting for Temporal's heartbeat to deliver it."""
    circuit_failures: int = Field(default=5, ge=1)
    """Outage failures in a row at one place (a provider's model: `provider_5xx`, `timeout`),
    whichever jobs and workers they came from, that open its circuit: jobs that can run
    elsewhere (`options.fallbacks`, a route) start their attempts at their next place
    instead, spending none there, until the cool-down passes. A success there closes it."""
    circuit_cooldown_s: float = Field(default=30.0, gt=0)
    """How long an open circuit sends jobs elsewhere before the next call tries the place
    again (a failure opens it again at once; a success closes it)."""
    fallback_after_s: float = Field(default=30.0, ge=0)
    """How long a job with other places (`options.fallbacks`, a route) waits for room in its
    place's provider budget before its attempt starts at the next place instead, spending
    no attempt; a job may say its own (`options.fallback_after_s`)."""
    routes_file: Path | None = None
    """Named routes (TOML): `[routes]` with `NAME = ["provider/model", …]`, the places a job
    naming the route runs at, in order (the first, then the others as its fallbacks;
    docs/providers.md). Clients name a route in `options.route` or as the OpenAI routes'
    `model`; `GET /v1/models` lists them. Read at start-up: a change takes a restart."""
    prices_file: Path | None = None
    """Price table (TOML): US dollars per million input and output tokens, per model name or
    pattern (docs/usage.md). An attempt on a model it does not price costs "unknown" (null),
    never 0. Unset: only the `fake` provider's models are priced (at 0)."""
    webhook_allow_hosts: list[str] = Field(default_factory=list)
    """Webhook hosts allowed although they resolve inside a network (loopback, private,
    link-local): for development and tests. Public addresses need no allowing
    (docs/webhooks.md)."""
    webhook_allow_ranges: list[str] = Field(default_factory=list)
    """Address ranges (CIDR, e.g. `127.0.0.0/8`, `10.1.0.0/16`) webhooks may reach although
    they are inside a network."""
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60)
    """A webhook try's read timeout (connecting: at most 5 s of it); past it the try fails
    and is tried again later."""
    webhook_first_retry_s: float = Field(default=5.0, gt=0, le=3600)
    """The wait before a webhook delivery's second try; each next waits three times longer,
    up to 6 h, for about three days in all (docs/webhooks.md)."""
    webhook_longest_wait_s: float = Field(default=21_600.0, gt=0, le=86_400)
    """The longest wait between two tries of a webhook delivery (6 h)."""
    webhook_max_per_endpoint: int = Field(default=8, ge=1)
    """Tries in flight at once per endpoint in each worker: one tenant's slow endpoint holds
    at most this many of a worker's slots."""
    caps_allow_unpriced: bool = False
    """Let jobs under a spend cap (`promptjobs orgs limit --usd-per-day`) run on models the
    price table does not price, counted as free. Off: such a job is refused at submission
    (422 `unpriced_model`), and one already queued waits, naming the missing price."""

    # Observability (docs/operators.md).
    metrics_token: SecretStr | None = None
    """Bearer token `GET /metrics` (and a worker's metrics port) require; unset: open, as
    `/healthz` is. Prometheus sends it with `authorization: {credentials: ...}`."""
    metrics_org_labels: bool = False
    """Label `promptjobs_submissions_total` with the submitting org. Off by default: an open
    `/metrics` then names no tenant. Turn it on together with `PROMPTJOBS_METRICS_TOKEN`."""
    metrics_cache_s: float = Field(default=5.0, ge=0)
    """How long `/metrics` reuses the jobs-per-state count it read from the projection, so
    frequent or concurrent scrapes cost one query per interval."""
    worker_metrics_host: str = "127.0.0.1"
    """Address a worker's Prometheus endpoint listens on (`0.0.0.0` in a container)."""
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of a worker's Prometheus endpoint (`/metrics`: our counters and the Temporal SDK's
    worker metrics on one port); unset: the worker serves no metrics."""
    worker_heartbeat_s: float = Field(default=15.0, gt=0)
    """How often a worker records itself in the projection's `workers` table (what
    `promptjobs status` shows: last heartbeat and configuration)."""
    retention_days: float = Field(default=30.0, ge=0)
    """Settled jobs finished longer ago than this are removed (with their events, and their
    prompt and responses once the prompt has no job left), by a Temporal Schedule that the
    workers keep (`promptjobs-retention-<task queue>`, in the Web UI's Schedules page).
    Fractions of a day are allowed; 0 turns retention off and deletes the schedule."""
    retention_interval_s: float = Field(default=3600.0, gt=0)
    """How often the retention schedule runs."""
    retention_batch: int = Field(default=500, ge=1)
    """Jobs the retention run removes per transaction (each holds the write lock briefly)."""
    otel_traces_exporter: Literal["otlp", "console", "none"] | None = Field(
        default=None,
        validation_alias=AliasChoices("OTEL_TRACES_EXPORTER"),
        description=(
            "Where traces go (OpenTelemetry's standard variable): `otlp`, `console` or `none`. "
            "Unset: `otlp` if an OTLP endpoint is set, otherwise tracing is off (no cost)."
        ),
    )
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
        ),
        description=(
            "OTLP/HTTP collector, e.g. `http://otel-collector:4318` (`/v1/traces` is added "
            "unless the URL already ends with it). Setting it turns tracing on."
        ),
    )
    otel_service_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("OTEL_SERVICE_NAME"),
        description="Service name on the spans; default `promptjobs-api`, `promptjobs-worker` "
        "or `promptjobs-dev` by process.",
    )

    @model_validator(mode="after")
    def _client_certificate_comes_with_its_key(self) -> Settings:
        if (self.temporal_tls_cert_path is None) != (self.temporal_tls_key_path is None):
            raise ValueError(
                "PROMPTJOBS_TEMPORAL_TLS_CERT_PATH and PROMPTJOBS_TEMPORAL_TLS_KEY_PATH "
                "go together: set both or neither"
            )
        return self

    @property
    def provider_default(self) -> Literal["fake", "openai", "anthropic"]:
        """The provider of a job whose options name none (`default_provider`, resolved)."""
        if self.default_provider is not None:
            return self.default_provider
        if self.fake_adapter:
            return "fake"
        if self.anthropic_api_key is not None and self.openai_api_key is None:
            return "anthropic"
        return "openai"

    def environment(self) -> dict[str, str]:
        """These settings as the environment variables that give them, for a process of
        ours started with the same configuration (`promptjobs dev` starts its worker so)."""
        variables: dict[str, str] = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is None:
                continue
            alias = field.validation_alias
            if isinstance(alias, AliasChoices):
                variable = str(alias.choices[0])
            else:
                variable = f"PROMPTJOBS_{name.upper()}"
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, Path):
                value = value.resolve()
            variables[variable] = str(value)
        return variables

    @property
    def projection_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'promptjobs.db').resolve()}"

    @property
    def tracing_exporter(self) -> Literal["otlp", "console"] | None:
        """The span exporter to use, or None when tracing is off."""
        exporter = self.otel_traces_exporter
        if exporter is None:
            return "otlp" if self.otel_exporter_otlp_endpoint else None
        return None if exporter == "none" else exporter

    @property
    def otlp_traces_url(self) -> str:
        endpoint = self.otel_exporter_otlp_endpoint or "http://localhost:4318"
        if endpoint.rstrip("/").endswith("/v1/traces"):
            return endpoint
        return endpoint.rstrip("/") + "/v1/traces"

    @property
    def temporal_uses_tls(self) -> bool:
        return bool(
            self.temporal_tls
            or self.temporal_tls_cert_path
            or self.temporal_tls_ca_path
            or self.temporal_tls_server_name
            or self.temporal_api_key
        )

    @cached_property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(
            initial_s=self.backoff_initial_s,
            coefficient=self.backoff_coefficient,
            maximum_s=self.backoff_max_s,
            jitter=self.backoff_jitter,
            rate_limit_default_s=self.rate_limit_default_s,
        )
