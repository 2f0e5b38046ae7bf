"""The `promptjobs` command line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError

from activities.adapters.routes import InvalidRoutes
from activities.prices import InvalidPrices
from projections.domain.errors import Refused
from projections.migrate import StoreUnavailable, database_error
from promptjobs import cli_batches, cli_budgets, cli_jobs, cli_orgs, cli_webhooks
from promptjobs.console import CliError, iso, run
from promptjobs.launch import (
    DevStack,
    LaunchError,
    ensure_port_free,
    run_api,
    run_dev,
    run_worker,
    stop_on_signals,
)
from promptjobs.observability import install_core_logging
from promptjobs.settings import Settings

app = typer.Typer(
    rich_markup_mode=None,
    help="Durable LLM prompt jobs on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
keys_app = typer.Typer(rich_markup_mode=None, help="API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
history_app = typer.Typer(
    rich_markup_mode=None, help="Workflow histories, for replay tests.", no_args_is_help=True
)
app.add_typer(history_app, name="history")


def settings_with(**overrides: Any) -> Settings:
    settings = Settings()
    values = {k: v for k, v in overrides.items() if v is not None}
    return settings.model_copy(update=values) if values else settings


async def _until_signal(starter: Any, settings: Settings, **kwargs: Any) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    await starter(settings, stop=stop, **kwargs)


def shell_path(path: Path) -> str:
    """`path` as short as it can be said from here."""
    try:
        return shlex.quote(str(path.resolve().relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(path.resolve()))


def _print_stack(stack: DevStack) -> None:
    typer.echo(
        "\n".join(
            [
                "promptjobs is running (Ctrl-C stops it)",
                f"  API          {stack.api_url}",
                f"  Web page     {stack.api_url}/?key={stack.api_key}",
                f"  API docs     {stack.api_url}/docs",
                f"  Metrics      {stack.api_url}/metrics (API)",
                f"               {stack.worker_metrics_url} (worker)",
                f"  Temporal UI  {stack.ui_url or '(disabled)'}",
                f"  Temporal     {stack.temporal_address}",
                f"  Database     {stack.database_url}",
                f"  API key      {stack.api_key}",
                "",
                "In another shell (the CLI, the Python client):",
                f"  source {shell_path(stack.env_file)}",
                "",
                "Try:",
                f"  curl -s -X POST {stack.api_url}/v1/prompts \\",
                f"    -H 'Authorization: Bearer {stack.api_key}' \\",
                "    -H 'Content-Type: application/json' -d '{\"prompt\": \"Hello\"}'",
            ]
        )
    )


@app.command()
def dev(
    api_port: Annotated[int | None, typer.Option(help="API port (default 8000)")] = None,
    temporal_port: Annotated[int | None, typer.Option(help="Temporal port (default 7233)")] = None,
    ui_port: Annotated[int | None, typer.Option(help="Temporal Web UI port (default 8233)")] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Where data is kept (default .data)")
    ] = None,
    no_ui: Annotated[bool, typer.Option("--no-ui", help="Run Temporal without its Web UI")] = False,
) -> None:
    """Run everything embedded: Temporal dev server + Web UI, a worker, the API, SQLite."""
    settings = settings_with(api_port=api_port, temporal_ui_port=ui_port, data_dir=data_dir)
    if "fake_adapter" not in settings.model_fields_set:
        # The embedded stack is for trying things: the fake provider is on unless turned off.
        settings = settings.model_copy(update={"fake_adapter": True})
    if temporal_port is not None:
        settings = settings.model_copy(update={"temporal_address": f"127.0.0.1:{temporal_port}"})
    typer.echo("starting the Temporal dev server, a worker and the API…")
    run(_until_signal(run_dev, settings, ui=not no_ui, on_ready=_print_stack))
    typer.echo("promptjobs stopped")


@app.command()
def api() -> None:
    """Run the API (and its dispatcher) alone, configured by PROMPTJOBS_* variables."""
    run(_until_signal(run_api, Settings()))


@app.command()
def worker() -> None:
    """Run a worker alone, configured by PROMPTJOBS_* variables."""
    run(_until_signal(run_worker, Settings()))


@app.command("mock-provider")
def mock_provider(
    port: Annotated[int, typer.Option(help="Port to listen on")] = 9000,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    rpm: Annotated[
        int | None, typer.Option(min=1, help="Answer 429 past this many requests a minute")
    ] = None,
    tpm: Annotated[
        int | None, typer.Option(min=1, help="Answer 429 past this many tokens a minute")
    ] = None,
) -> None:
    """Run a scripted OpenAI- and Anthropic-compatible provider (docs/providers.md)."""
    from promptjobs.mock_provider import Limits, run_mock_provider

    ensure_port_free(host, port, "mock provider", "--port")
    url = f"http://{host}:{port}"
    ready = "\n".join(
        [
            f"mock provider on {url} (Ctrl-C stops it); point promptjobs at it with",
            f"  PROMPTJOBS_OPENAI_BASE_URL={url}/v1 PROMPTJOBS_OPENAI_API_KEY=mock",
            f"  PROMPTJOBS_ANTHROPIC_BASE_URL={url} PROMPTJOBS_ANTHROPIC_API_KEY=mock",
            'and script failures in a job\'s options: {"provider": "openai", '
            '"model": "mock:fail=429,500;retry_after=2"}',
        ]
    )
    if rpm or tpm:
        limits = [f"{rpm} requests" if rpm else "", f"{tpm} tokens" if tpm else ""]
        ready += f"\nrate limits: {' and '.join(filter(None, limits))} per sliding minute"

    async def serve_until_signal() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        await run_mock_provider(
            host,
            port,
            stop=stop,
            on_ready=lambda: typer.echo(ready),
            limits=Limits(rpm=rpm, tpm=tpm),
        )

    run(serve_until_signal())


@keys_app.command("create")
def keys_create(
    org: Annotated[str, typer.Option(help="The organisation the key acts for")],
    user: Annotated[str, typer.Option(help="The user the key acts as")],
    role: Annotated[str, typer.Option(help="member (own prompts) or admin (whole org)")] = "member",
    usd_per_day: Annotated[
        float | None,
        typer.Option(min=0, help="US dollars its jobs may spend in a UTC day (0: no cap)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Create an API key. It is shown once; only its hash is stored."""
    from projections.keys import ROLES
    from promptjobs.wiring import open_projection

    if role not in ROLES:
        raise CliError(f"--role must be one of {', '.join(ROLES)}, not {role!r}")

    async def create() -> Any:
        async with open_projection(Settings(), streams=False, create=False) as projection:
            try:
                return await projection.store.keys.create(
                    org, user, role, usd_per_day=usd_per_day or None
                )
            except ValueError as err:
                raise CliError(str(err)) from err

    issued = run(create())
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "key": issued.secret,
                    "key_id": issued.key_id,
                    "org": org,
                    "user": user,
                    "role": role,
                    "usd_per_day": usd_per_day or None,
                }
            )
        )
    else:
        cap = f", at most ${usd_per_day:g} a day" if usd_per_day else ""
        typer.echo(
            f"{issued.secret}\n(org {org}, user {user}, role {role}{cap}; shown once, keep it)"
        )


@keys_app.command("list")
def keys_list(
    org: Annotated[str | None, typer.Option(help="Only this organisation's keys")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """List API keys (never their secrets), revoked ones too, oldest first."""
    from promptjobs.cli_orgs import cap_cells
    from promptjobs.console import console, counted, emit_json, table
    from promptjobs.wiring import open_projection

    async def fetch() -> Any:
        async with open_projection(Settings(), streams=False, create=False) as projection:
            standings = await projection.store.spend_caps.standings(datetime.now(UTC))
            capped = {s.cap.key_id: s for s in standings if s.cap.key_id is not None}
            return await projection.store.keys.list(org), capped

    keys, capped = run(fetch())
    rows = [
        {
            "key_id": key.key_id,
            "org": key.org,
            "user": key.user,
            "role": key.role,
            "created_at": key.created_at,
            "revoked_at": key.revoked_at,
            "usd_per_day": key.usd_per_day,
            "used_today": None if key.key_id not in capped else capped[key.key_id].used,
        }
        for key in keys
    ]
    if as_json:
        emit_json(rows)
    else:
        columns = ("key_id", "org", "user", "role", "created_at", "revoked_at")
        cells = (
            [*(row[column] for column in columns), *cap_cells(capped.get(row["key_id"]))]
            for row in rows
        )
        console().print(table(counted(len(rows), "key"), (*columns, "usd/day", "today"), cells))


@keys_app.command("limit")
def keys_limit(
    key_id: Annotated[str, typer.Argument(help="The key's id (`keys list`, or `pj_<id>_...`)")],
    usd_per_day: Annotated[
        float,
        typer.Option(min=0, help="US dollars its jobs may spend in a UTC day (0: no cap)"),
    ],
) -> None:
    """Set an API key's spend cap: its jobs' US dollars a day, within its org's cap. Every
    worker applies it within 2 s; calls already running keep going."""
    from projections.keys import key_id_of
    from promptjobs.wiring import open_projection

    shown = key_id_of(key_id) or key_id

    async def apply() -> bool:
        async with open_projection(Settings(), streams=False, create=False) as projection:
            return await projection.store.spend_caps.set_key_cap(shown, usd_per_day or None)

    if not run(apply()):
        raise CliError(f"no API key {shown} (`promptjobs keys list` shows them)")
    cap = f"at most ${usd_per_day:g} a day" if usd_per_day else "no spend cap of its own"
    typer.echo(f"{shown}: {cap}")


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (`keys list`, or `pj_<id>_...`)")],
) -> None:
    """Revoke an API key, by its id or whole. Every API process refuses it within
    `api_key_cache_ttl_s`."""
    from projections.keys import key_id_of
    from promptjobs.wiring import open_projection

    settings = Settings()

    async def revoke() -> Any:
        async with open_projection(settings, streams=False, create=False) as projection:
            return await projection.store.keys.revoke(key_id)

    revoked = run(revoke())
    if revoked is None:
        shown = key_id_of(key_id) or key_id
        raise CliError(f"no API key {shown} (`promptjobs keys list` shows them)")
    key = revoked.key
    if revoked.already:
        revoked_at = iso(key.revoked_at)
        typer.echo(
            f"{key.key_id} (org {key.org}, user {key.user}) was revoked already, {revoked_at}"
        )
        return
    typer.echo(
        f"revoked {key.key_id} (org {key.org}, user {key.user});"
        f" API processes refuse it within {settings.api_key_cache_ttl_s:g} s"
    )


@history_app.command("export")
def history_export(
    job_id: Annotated[str, typer.Argument(help="The job (= workflow) id")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default: stdout)")
    ] = None,
) -> None:
    """Write a job's workflow history as JSON, as `temporal workflow show --output json` does;
    `temporalio.worker.Replayer` reads it (see docs/workflow-versioning.md)."""
    from temporalio.service import RPCError

    from promptjobs.history import export_history
    from promptjobs.wiring import connect_temporal

    settings = Settings()

    async def export() -> str:
        try:
            client = await connect_temporal(settings)
            return await export_history(client, job_id)
        except RPCError as err:
            raise CliError(f"cannot read the history of {job_id}: {err.message}") from err
        except RuntimeError as err:
            raise CliError(
                f"Temporal at {settings.temporal_address} is unreachable: {err}"
            ) from err

    text = run(export())
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        typer.echo(f"wrote {output}", err=True)


cli_jobs.register(app)
cli_orgs.register(app)
cli_budgets.register(app)
cli_batches.register(app)
cli_webhooks.register(app)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    install_core_logging()
    code = 0
    try:
        app()
    except (
        CliError,
        Refused,
        LaunchError,
        InvalidPrices,
        InvalidRoutes,
        FileNotFoundError,
        StoreUnavailable,
    ) as err:
        typer.echo(f"error: {err}", err=True)
        code = 1
    except DBAPIError as err:
        # The database went away mid-command (it answered when the command began).
        typer.echo(f"error: the database failed: {database_error(err)}", err=True)
        code = 1
    except ValidationError as err:
        typer.echo(f"error: invalid configuration (PROMPTJOBS_* variables): {err}", err=True)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except SystemExit as done:  # click ends every command with sys.exit
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if isinstance(done.code, str):
            typer.echo(done.code, err=True)
    # The Temporal client's native runtime can abort the process when it is torn down during
    # interpreter finalisation (PyGILState_Release); every command is finished by now, so
    # flush and leave without finalising.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
