"""`promptjobs jobs …` and `promptjobs status`: the operator's commands, across every org.

They talk to the same database and Temporal as the service (Settings from the environment)
and act through the same JobService as the API, as the operator scope.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Annotated, Any

import typer

from activities.adapters.base import InvalidOptions
from projections import operations
from projections.budgets import BudgetStanding
from projections.circuits import CircuitStanding
from projections.domain.lifecycle import EventType, JobState
from projections.errors import NotFound
from projections.event_log import utcnow
from projections.models import AttemptRecord, Job, JobEvent, Prompt, Response, WorkerProcess
from projections.scope import Scope
from projections.spend import CapStanding
from promptjobs.cli_budgets import budgets_table, standing_json
from promptjobs.console import (
    JOB_COLUMNS,
    CliError,
    console,
    counted,
    emit_json,
    iso,
    job_cells,
    operator_row,
    parse_retry_changes,
    parse_state,
    parse_when,
    run,
    short,
    table,
)
from promptjobs.settings import Settings
from promptjobs.wiring import (
    Projection,
    build_adapters,
    build_dispatcher,
    build_job_service,
    connect_temporal,
    disagreement_with_dev,
    open_projection,
)
from services.fleet import task_queue_pollers
from services.jobs import JobService
from services.passes import TemporalUnreachable

jobs_app = typer.Typer(
    rich_markup_mode=None,
    help="Jobs of every org: list, show, cancel, retry, metrics, archive.",
    no_args_is_help=True,
)

OPERATOR = Scope.operator()
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts")]
WORKERS_SEEN_S = 3600.0
# The columns of `status`'s worker table, in operations.WorkerSeen's order.
WORKER_COUNTS = (JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def register(app: typer.Typer) -> None:
    app.add_typer(jobs_app, name="jobs")
    app.command("status")(status)


# -- wiring ------------------------------------------------------------------------------


@asynccontextmanager
async def operator_projection() -> AsyncIterator[Projection]:
    async with open_projection(Settings(), streams=False, create=False) as projection:
        yield projection


@asynccontextmanager
async def operator_service() -> AsyncIterator[tuple[JobService, Settings]]:
    """The API's JobService over a lazy Temporal client: reads work while Temporal is down."""
    settings = Settings()
    warn_if_elsewhere(settings)
    client = await connect_temporal(settings, lazy=True)
    async with open_projection(settings, streams=False, create=False) as projection:
        dispatcher = build_dispatcher(settings, client, projection)
        yield (
            build_job_service(settings, projection, dispatcher, build_adapters(settings)),
            settings,
        )


# -- jobs --------------------------------------------------------------------------------


@jobs_app.command("list")
def list_jobs(
    state: Annotated[str | None, typer.Option(help="Only jobs in this state")] = None,
    org: Annotated[str | None, typer.Option(help="Only this org's jobs")] = None,
    since: Annotated[
        str | None, typer.Option(help="Created at or after: ISO date/time or an age (12h, 7d)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Jobs of every org, newest first."""
    wanted = parse_state(state)
    after = parse_when(since, "--since") if since else None

    async def fetch() -> tuple[list[Job], dict[str, int]]:
        async with operator_projection() as projection:
            operations = projection.store.operations
            jobs = await operations.list_jobs(state=wanted, org=org, since=after, limit=limit)
            return jobs, await operations.spared_calls([job.job_id for job in jobs])

    jobs, spared = run(fetch())
    if as_json:
        emit_json({"jobs": [operator_row(job) for job in jobs]})
        return
    cells = (job_cells(job, spared.get(job.job_id, 0)) for job in jobs)
    console().print(table(counted(len(jobs), "job"), JOB_COLUMNS, cells))


# The prompt's and the answer's text shown in a table at most (all of it with --json).
SHOWN_CHARS = 2_000


@dataclass(frozen=True)
class JobView:
    """What `jobs show` shows of one job."""

    job: Job
    prompt: Prompt
    answer: Response | None
    events: list[JobEvent]
    attempts: list[AttemptRecord]
    others: list[Job]
    waits: str | None


@jobs_app.command("show")
def show(job_id: str, as_json: JsonOpt = False) -> None:
    """One job: its prompt and answer, its events and attempts, and the other jobs of its
    prompt."""

    async def fetch() -> JobView:
        async with operator_projection() as projection:
            store = projection.store
            job = await store.job(OPERATOR, job_id)
            events = await store.job_events(OPERATOR, job_id)
            prompt, siblings = await store.prompt(OPERATOR, job.prompt_id)
            _job, attempts = await store.attempts(OPERATOR, job_id)
            answer = None
            if job.response_id is not None:
                answer = await store.response(OPERATOR, job.response_id)
            waits = None
            if job.waiting_on and job.state is JobState.QUEUED:
                # The parents as they stand now, not as the workflow last checked them.
                waits = (await store.chains.parents_state(job.prompt_id)).detail
            others = [other for other in siblings if other.job_id != job_id]
            return JobView(job, prompt, answer, events, attempts, others, waits)

    try:
        view = run(fetch())
    except NotFound as err:
        raise CliError(f"no job {job_id}") from err
    job = view.job
    if as_json:
        emit_json(
            {
                "job": operator_row(job),
                "prompt": {
                    "prompt_id": view.prompt.prompt_id,
                    "text": view.prompt.text,
                    "messages": view.prompt.messages,
                },
                "answer": None if view.answer is None else _answer(view.answer),
                "waits_on": view.waits,
                "events": [_event(event) for event in view.events],
                "attempts": [_attempt(attempt) for attempt in view.attempts],
                "prompt_jobs": [operator_row(other) for other in view.others],
            }
        )
        return
    out = console()
    fields = operator_row(job)
    options = fields.pop("options")
    out.print(table(f"job {job_id}", ("field", "value"), fields.items()))
    # On one line, unwrapped, as `jobs retry --options` takes it back.
    typer.echo(f"options {json.dumps(options, ensure_ascii=False)}")
    typer.echo(f"\nprompt {view.prompt.prompt_id}:\n{_excerpt(view.prompt.text)}")
    if view.answer is not None:
        # A tool call reads as a conversation's transcript writes one: → name(arguments).
        calls = "".join(
            f"\n→ {call['name']}({call['arguments']}) [{call['id']}]"
            for call in view.answer.tool_calls or ()
        )
        parsed = view.answer.output_json
        # A job with an output schema: its JSON, checked and laid out.
        said = view.answer.text if parsed is None else json.dumps(parsed, indent=2)
        typer.echo(
            f"\nanswer ({view.answer.provider}/{view.answer.model}, "
            f"{view.answer.finish_reason or 'no finish reason'}"
            f"{', matches its output schema' if parsed is not None else ''}):\n"
            f"{_excerpt(said)}{calls}"
        )
    if view.waits:
        out.print(
            f"waits on parent prompt(s) {view.waits} to succeed "
            "(a failed or cancelled parent: retry it and this job goes on)"
        )
    out.print(
        table(
            "events",
            ("id", "at", "state", "attempt", "error"),
            (
                (
                    e.id,
                    short(e.created_at),
                    e.state.value,
                    e.data.get("attempt"),
                    # A row keeps its last error while the next attempt runs: an event shows
                    # the error only where its state has one.
                    e.data.get("error_kind") if e.state.shows_error else None,
                )
                for e in view.events
                if e.type == EventType.STATE_CHANGED
            ),
        )
    )
    if view.attempts:
        out.print(
            table(
                "attempts",
                ("attempt", "outcome", "model", "tokens in/out", "cost", "took", "via"),
                (
                    (
                        a.attempt,
                        _outcome(a),
                        f"{a.provider}/{a.model}",
                        f"{a.input_tokens}/{a.output_tokens}",
                        "unpriced" if a.cost_usd is None else f"${a.cost_usd:.6f}",
                        f"{a.duration_ms / 1000:.1f} s",
                        a.via or "",
                    )
                    for a in view.attempts
                ),
            )
        )
    if view.others:
        out.print(
            table(f"other jobs of prompt {job.prompt_id}", JOB_COLUMNS, map(job_cells, view.others))
        )


def _excerpt(text: str) -> str:
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}… ({len(text):,} characters; --json shows all)"


def _outcome(attempt: AttemptRecord) -> str:
    """An attempt's outcome, a schema miss's first error (its place and fault), and why
    the job moved on to its next place after it."""
    said = attempt.outcome
    if errors := attempt.errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        said = f"{said}: at {errors[0]['path']}: {errors[0]['message']}{more}"
    if attempt.moved_on:
        said = f"{said}; moved on: {attempt.moved_on}"
    return said


def _answer(answer: Response) -> dict[str, Any]:
    return {
        "response_id": answer.response_id,
        "text": answer.text,
        "output_json": answer.output_json,
        "provider": answer.provider,
        "model": answer.model,
        "finish_reason": answer.finish_reason,
        "tool_calls": answer.tool_calls,
    }


def _attempt(attempt: AttemptRecord) -> dict[str, Any]:
    return {
        "attempt": attempt.attempt,
        "outcome": attempt.outcome,
        "provider": attempt.provider,
        "model": attempt.model,
        "input_tokens": attempt.input_tokens,
        "output_tokens": attempt.output_tokens,
        "cost_usd": attempt.cost_usd,
        "duration_ms": attempt.duration_ms,
        "started_at": iso(attempt.started_at),
        "via": attempt.via,
        "errors": attempt.errors,
        "moved_on": attempt.moved_on,
    }


def _event(event: JobEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "type": event.type,
        "state": event.state.value,
        "created_at": iso(event.created_at),
        "data": event.data,
    }


@jobs_app.command("cancel")
def cancel(job_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a queued or running job (delivered to its workflow before this returns)."""

    async def act() -> Job:
        async with operator_service() as (service, settings):
            try:
                return await service.cancel(OPERATOR, job_id, wait=True)
            except TemporalUnreachable as err:
                raise CliError(
                    f"cancel of {job_id} is recorded, but Temporal at {settings.temporal_address} "
                    f"is unreachable ({err}); the API's dispatcher delivers it once it is back"
                ) from err

    job = _acting(act(), job_id)
    _report(job, as_json, f"{job_id}: cancel delivered; the job is {job.state.value}")


@jobs_app.command("retry")
def retry(
    job_id: str,
    options: Annotated[
        str | None, typer.Option(help="JSON options replacing the old job's, as in a submission")
    ] = None,
    priority: Annotated[int | None, typer.Option(help="0 (most urgent) … 100")] = None,
    max_attempts: Annotated[int | None, typer.Option(help="1 … 10")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a settled job's prompt again as a new job that supersedes it (with the old job's
    options, priority and max attempts, unless given)."""
    changes = parse_retry_changes(options, priority, max_attempts)

    async def act() -> Job:
        async with operator_service() as (service, settings):
            try:
                return await service.retry(OPERATOR, job_id, changes, wait=True)
            except TemporalUnreachable as err:
                raise CliError(
                    f"retry of {job_id} is recorded, but Temporal at {settings.temporal_address} "
                    f"is unreachable ({err}); the API's dispatcher starts it once it is back"
                ) from err

    job = _acting(act(), job_id)
    _report(job, as_json, f"{job.job_id}: started; supersedes {job_id}")


def _acting(work: Any, job_id: str) -> Job:
    try:
        job: Job = run(work)
    except NotFound as err:
        raise CliError(f"no job {job_id}") from err
    except InvalidOptions as err:
        raise CliError(f"--options: {err}") from err
    return job


def _report(job: Job, as_json: bool, line: str) -> None:
    if as_json:
        emit_json(operator_row(job))
    else:
        typer.echo(line)


@jobs_app.command("metrics")
def metrics(
    org: Annotated[str | None, typer.Option(help="Only this org")] = None,
    since: Annotated[
        str | None, typer.Option(help="Jobs created at or after: ISO date/time or an age (7d)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per org: jobs by state, wait (created→started) and run (started→finished) latency in
    seconds (mean and percentiles), error rate (failed / settled) and error kinds; and per
    org and model, the tokens and cost of the attempts that ended since then."""
    after = parse_when(since, "--since") if since else None

    async def fetch() -> tuple[list[operations.OrgMetrics], list[operations.UsageMetrics]]:
        async with operator_projection() as projection:
            views = projection.store.operations
            return (
                await views.queue_metrics(since=after, org=org),
                await views.usage_metrics(since=after, org=org),
            )

    per_org, usage = run(fetch())
    if as_json:
        emit_json({"orgs": [asdict(m) for m in per_org], "usage": [asdict(u) for u in usage]})
        return
    out = console()
    states = [state.value for state in JobState]
    out.print(
        table("jobs by state", ("org", *states), ([m.org, *m.states.values()] for m in per_org))
    )
    pcts = ["mean", *(f"p{p}" for p in operations.PERCENTILES)]
    out.print(
        table(
            "latency (s) and error rate (failed / settled)",
            ("org", *(f"wait {p}" for p in pcts), *(f"run {p}" for p in pcts), "error rate"),
            (
                [m.org, *m.wait_s.values(), *m.run_s.values(), _percent(m.error_rate)]
                for m in per_org
            ),
        )
    )
    out.print(
        table(
            "error kinds (failed, and re-queued after a failed attempt)",
            ("org", "error kind", "jobs"),
            ((m.org, kind, n) for m in per_org for kind, n in m.error_kinds.items()),
        )
    )
    out.print(
        table(
            "usage by model (attempts that ended; cost of the priced ones, in USD)",
            (
                "org",
                "provider",
                "model",
                "attempts",
                "input tokens",
                "output tokens",
                "cost",
                "unpriced",
                "estimated",
            ),
            (
                [
                    u.org,
                    u.provider,
                    u.model,
                    u.attempts,
                    u.input_tokens,
                    u.output_tokens,
                    f"{u.cost_usd:.6f}",
                    u.unpriced,
                    u.estimated,
                ]
                for u in usage
            ),
        )
    )


def _percent(rate: float | None) -> str:
    return "" if rate is None else f"{rate:.1%}"


@jobs_app.command("archive")
def archive(
    before: Annotated[str, typer.Option(help="Finished before: ISO date/time or an age (30d)")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count, remove nothing")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove settled jobs finished before a date, with their events; a prompt left with no
    job goes too, with its responses. In batches of PROMPTJOBS_RETENTION_BATCH jobs, a
    transaction each, so that submits and streams go on meanwhile; interrupted, run it
    again."""
    cutoff = parse_when(before, "--before")

    def progress(so_far: operations.Archived) -> None:
        if not as_json:
            typer.echo(f"… {so_far.jobs} jobs removed so far", err=True)

    async def act() -> operations.Archived:
        async with operator_projection() as projection:
            if dry_run:
                return await projection.store.operations.archive(before=cutoff, dry_run=True)
            return await projection.store.operations.archive_in_batches(
                before=cutoff,
                batch=Settings().retention_batch,
                progress=progress,
            )

    done = run(act())
    if as_json:
        emit_json({**asdict(done), "before": iso(cutoff)})
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(
        f"{verb} {done.jobs} jobs, {done.events} events, {done.prompts} prompts and "
        f"{done.responses} responses finished before {iso(cutoff)}"
    )


# -- status ------------------------------------------------------------------------------


def warn_if_elsewhere(settings: Settings) -> str | None:
    """Say on stderr when this command reads `promptjobs dev`'s store but would reach another
    Temporal (a shell that did not `source .data/env`)."""
    if (warning := disagreement_with_dev(settings)) is not None:
        typer.secho(f"warning: {warning}", err=True, fg=typer.colors.YELLOW)
    return warning


def status(as_json: JsonOpt = False) -> None:
    """The fleet at a glance: jobs per state, workers seen in the projection, provider
    budgets, and Temporal's pollers on the task queue (with when each last polled). Exits 1
    when Temporal cannot be reached, so a script can tell."""
    warning = warn_if_elsewhere(Settings())
    health, registered, budgets, circuits, caps, temporal = run(_status())
    if warning is not None:
        temporal["warning"] = warning
    if as_json:
        emit_json(
            {
                "projection": asdict(health),
                "registered_workers": [_registered(w) for w in registered],
                "provider_budgets": [standing_json(b) for b in budgets],
                "circuits": [_circuit(c) for c in circuits],
                "spend_caps": [_cap(c) for c in caps],
                "temporal": temporal,
            }
        )
        if temporal.get("error"):
            raise typer.Exit(1)
        return
    out = console()
    out.print(table("jobs", ("state", "jobs"), health.states.items()))
    typer.echo(f"last transition: {short(health.last_transition_at) or 'none yet'}")
    out.print(
        table(
            "worker processes (their own heartbeats, last hour)",
            ("worker", "status", "last heartbeat", "started", "configuration"),
            (
                (
                    w.identity,
                    _liveness(w),
                    short(w.heartbeat_at),
                    short(w.started_at),
                    _config_line(w.config),
                )
                for w in registered
            ),
        )
    )
    out.print(
        table(
            "workers seen in the last hour (from the jobs they ran)",
            ("worker", "last seen", *(state.value for state in WORKER_COUNTS)),
            (
                (w.worker, short(w.last_seen), w.running, w.succeeded, w.failed, w.cancelled)
                for w in health.workers
            ),
        )
    )
    if budgets:
        out.print(budgets_table(budgets))
    if circuits:
        out.print(
            table(
                "provider circuits (places that failed lately)",
                ("place", "state", "failures in a row", "opened", "times opened"),
                (
                    (
                        c.place,
                        _circuit_state(c),
                        c.failures,
                        short(c.opened_at) or "never",
                        c.opened,
                    )
                    for c in circuits
                ),
            )
        )
    if caps:
        out.print(
            table(
                "spend caps (today, UTC)",
                ("cap", "usd/day", "spent", "held by calls in flight", "used", "waiting"),
                (
                    (
                        c.cap.name,
                        f"${c.cap.usd_per_day:g}",
                        f"${c.spent:.4f}",
                        f"${c.held:.4f}",
                        f"{c.share:.0%}",
                        c.waiting,
                    )
                    for c in caps
                ),
            )
        )
    if temporal.get("error"):
        typer.echo(
            f"Temporal at {temporal['address']}: unreachable ({temporal['error']})", err=True
        )
        raise typer.Exit(1)
    out.print(
        table(
            f"pollers on task queue {temporal['task_queue']} ({temporal['address']})",
            ("kind", "identity", "last poll", "backlog"),
            (
                (p["kind"], p["identity"], short(p["last_access_time"]), p["backlog"])
                for p in temporal["pollers"]
            ),
        )
    )


def _liveness(worker: WorkerProcess) -> str:
    """`stopped` once it said so; `silent` when it missed three beats (killed, or cut off
    from the database); `alive` otherwise."""
    if worker.stopped_at is not None:
        return "stopped"
    beat_s = Settings().worker_heartbeat_s
    if (utcnow() - worker.heartbeat_at).total_seconds() > 3 * beat_s:
        return "silent"
    return "alive"


def _config_line(config: dict[str, Any]) -> str:
    shown = (
        ("queue", config.get("task_queue")),
        ("slots", config.get("max_concurrent_activities")),
        ("wf tasks", config.get("max_concurrent_workflow_tasks")),
        ("provider", config.get("default_provider")),
        ("metrics", config.get("metrics_port") or "off"),
        ("tracing", config.get("tracing")),
    )
    return ", ".join(f"{name} {value}" for name, value in shown)


def _registered(worker: WorkerProcess) -> dict[str, Any]:
    return {
        "identity": worker.identity,
        "status": _liveness(worker),
        "started_at": worker.started_at,
        "heartbeat_at": worker.heartbeat_at,
        "stopped_at": worker.stopped_at,
        "config": worker.config,
    }


def _cap(standing: CapStanding) -> dict[str, Any]:
    cap = standing.cap
    return {
        "cap": cap.name,
        "org": cap.org,
        "key_id": cap.key_id,
        "usd_per_day": cap.usd_per_day,
        "spent": round(standing.spent, 6),
        "held": round(standing.held, 6),
        "share": round(standing.share, 4),
        "waiting": standing.waiting,
    }


def _circuit(circuit: CircuitStanding) -> dict[str, Any]:
    return {**asdict(circuit), "open": circuit.is_open(utcnow()), "state": _circuit_state(circuit)}


def _circuit_state(circuit: CircuitStanding) -> str:
    if circuit.is_open(utcnow()):
        return f"open until {short(circuit.open_until)}"
    if circuit.tripped:
        return "past its cool-down: one probe at a time"
    return "closed"


async def _status() -> tuple[
    operations.ProjectionHealth,
    list[WorkerProcess],
    list[BudgetStanding],
    list[CircuitStanding],
    list[CapStanding],
    dict[str, Any],
]:
    settings = Settings()
    async with open_projection(settings, streams=False, create=False) as projection:
        since = utcnow() - timedelta(seconds=WORKERS_SEEN_S)
        health = await projection.store.operations.projection_health(workers_since=since)
        registered = await projection.store.workers.since(since)
        budgets = await projection.store.budgets.standing(utcnow())
        circuits = await projection.store.circuits.standings()
        caps = await projection.store.spend_caps.standings(utcnow())
    temporal: dict[str, Any] = {
        "address": settings.temporal_address,
        "task_queue": settings.temporal_task_queue,
    }
    try:
        client = await connect_temporal(settings)
        temporal["pollers"] = await task_queue_pollers(client, settings.temporal_task_queue)
    except (RuntimeError, OSError) as err:  # connect failures surface as RuntimeError
        temporal["error"] = str(err).splitlines()[0]
    return health, registered, budgets, circuits, caps, temporal
