"""API keys as a user makes them: `promptjobs keys create` and `promptjobs dev`, run as real
processes, then used over real HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from projections.migrate import migrate
from projections.models import ApiKey
from tests.conftest import Stack, eventually
from tests.integration.processes import DevProcess

PROMPTJOBS = str(Path(sys.executable).parent / "promptjobs")


def promptjobs(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROMPTJOBS_DATABASE_URL": database_url}
    return subprocess.run(
        [PROMPTJOBS, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def test_keys_create_prints_a_key_once_stores_its_hash_and_the_key_works(
    stack: Stack,
) -> None:
    url = stack.settings.projection_url
    created = await asyncio.to_thread(
        promptjobs,
        *("keys", "create", "--org", "initech", "--user", "peter", "--role", "admin", "--json"),
        database_url=url,
    )
    assert created.returncode == 0, created.stderr
    issued = json.loads(created.stdout)
    assert issued["org"] == "initech" and issued["role"] == "admin"
    secret = issued["key"]

    async with stack.projection.sessions() as session:
        row = (
            await session.execute(select(ApiKey).where(ApiKey.key_id == issued["key_id"]))
        ).scalar_one()
    assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {row.key_hash, row.key_id, row.org, row.user}

    async with stack.as_user(secret) as peter:
        accepted = await peter.post("/v1/prompts", json={"prompt": "TPS report"})
        assert accepted.status_code == 202, accepted.text
        mine = (await peter.get("/v1/jobs", params={"since": "0"})).json()["jobs"]
    assert [job["job_id"] for job in mine] == [accepted.json()["job_id"]]
    # ...and it is initech's job: acme cannot see it.
    assert (await stack.http.get(f"/v1/jobs/{accepted.json()['job_id']}")).status_code == 404


async def test_keys_create_human_output_and_a_bad_role(stack: Stack) -> None:
    url = stack.settings.projection_url
    plain = await asyncio.to_thread(
        promptjobs, "keys", "create", "--org", "acme", "--user", "dave", database_url=url
    )
    assert plain.returncode == 0, plain.stderr
    key, note = plain.stdout.splitlines()
    assert re.fullmatch(r"pj_[0-9a-f]{12}_[A-Za-z0-9_-]+", key)
    assert "role member" in note and "shown once" in note
    async with stack.as_user(key) as dave:
        assert (await dave.get("/v1/jobs")).status_code == 200

    bad = await asyncio.to_thread(
        promptjobs, "keys", "create", "--org", "acme", "--user", "x", "--role", "root",
        database_url=url,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "--role must be one of member, admin" in bad.stderr

    # The org column holds 64 characters (PostgreSQL refuses more; SQLite would keep them).
    too_long = await asyncio.to_thread(
        promptjobs, "keys", "create", "--org", "a" * 65, "--user", "x", database_url=url
    )
    assert too_long.returncode == 1
    assert too_long.stderr.startswith("error: org must be 1 to 64 printable characters")
    assert len(too_long.stderr.splitlines()) == 1


@pytest.mark.parametrize("traces", ["none", "console"])
async def test_dev_prints_a_key_that_the_first_curl_can_use(tmp_path: Path, traces: str) -> None:
    """Also with traces printed (`OTEL_TRACES_EXPORTER=console`, a documented value, which the
    embedded Temporal server must not see), where the key sent in a stream's URL, as the web
    page sends it, never shows in a span."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OTEL_TRACES_EXPORTER": traces}
    dev = await DevProcess.start(tmp_path, "--data-dir", str(tmp_path / "data"), env=env)
    printed = dev.printed
    try:
        key = next(line for line in printed if "API key" in line).split()[-1]
        assert (tmp_path / "data" / "dev-api-key").read_text().strip() == key

        async with httpx.AsyncClient(
            base_url=dev.api_url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        ) as curl:
            accepted = await curl.post("/v1/prompts", json={"prompt": "Hello"})
            assert accepted.status_code == 202, accepted.text

            async def job() -> dict[str, Any]:
                row: dict[str, Any] = (await curl.get(accepted.headers["location"])).json()
                return row

            done = await eventually(job, lambda row: row["state"] == "succeeded", timeout=30)
            async with curl.stream(
                "GET", "/v1/events", params={"since": "0", "access_token": key}, headers={}
            ) as stream:
                assert stream.status_code == 200
        # A second shell, from anywhere, after `source <data dir>/env` as the banner says.
        env_file = tmp_path / "data" / "env"
        # Said as a path from where dev was started.
        assert any(f"source {env_file.relative_to(tmp_path)}" in line for line in printed)
        second_shell = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTJOBS_")}
        listed = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-c", f"source {env_file} && {PROMPTJOBS} jobs list --json"],
            env=second_shell, cwd="/", capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert [row["job_id"] for row in json.loads(listed.stdout)["jobs"]] == [done["job_id"]]
        assert done["response_id"]
    finally:
        output = await dev.stop()
    assert dev.process.returncode == 0
    # The banner shows it (its line, the web page's link, a curl); nothing else does.
    banner = ("API key", "Web page", "Bearer")
    shown = [line for line in output.splitlines() if key in line]
    assert [line for line in shown if not any(mark in line for mark in banner)] == []
    if traces == "console":
        assert "access_token=REDACTED" in output


async def test_a_revoked_key_stops_working_on_every_route_within_the_cache_ttl(
    stack: Stack,
) -> None:
    url = stack.settings.projection_url
    secret = await stack.key("initech", "milton")
    key_id = secret.split("_")[1]
    async with stack.as_user(secret) as milton:
        accepted = await milton.post("/v1/prompts", json={"prompt": "stapler"})
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        assert (await milton.get(f"/v1/jobs/{job_id}")).status_code == 200  # verified, cached

        # The whole key, as a user who has only the key pastes it, names it too.
        revoked = await asyncio.to_thread(promptjobs, "keys", "revoke", secret, database_url=url)
        assert revoked.returncode == 0, revoked.stderr
        assert revoked.stdout.startswith(f"revoked {key_id} (org initech, user milton)")
        again = await asyncio.to_thread(promptjobs, "keys", "revoke", key_id, database_url=url)
        assert again.returncode == 0, again.stderr
        assert "was revoked already" in again.stdout
        listed = await asyncio.to_thread(
            promptjobs, "keys", "list", "--org", "initech", "--json", database_url=url
        )
        [row] = json.loads(listed.stdout)
        assert row["key_id"] == key_id and row["revoked_at"] is not None

        ttl = stack.settings.api_key_cache_ttl_s
        refused = await eventually(
            lambda: milton.get(f"/v1/jobs/{job_id}"),
            lambda r: r.status_code == 401,
            timeout=ttl + 5,
        )
        assert refused.json()["type"].endswith("invalid_api_key")
        for answer in (
            await milton.post("/v1/prompts", json={"prompt": "again"}),
            await milton.get("/v1/jobs", params={"since": "0"}),
            await milton.post(f"/v1/jobs/{job_id}/cancel"),
        ):
            assert answer.status_code == 401, answer.text


def test_revoking_an_unknown_key_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    migrate(url)
    answer = promptjobs("keys", "revoke", "pj_0123456789ab_secret", database_url=url)
    assert answer.returncode == 1
    assert answer.stderr == "error: no API key 0123456789ab (`promptjobs keys list` shows them)\n"


@pytest.mark.parametrize(
    ("store", "says"),
    [
        ("sqlite:///{tmp}/nodata/promptjobs.db", "error: no promptjobs store at {tmp}/nodata/"),
        ("sqlite:////dev/null/x/promptjobs.db", "error: no promptjobs store at /dev/null/x/"),
        (
            "junk",
            "error: the database URL 'junk' is not one (PROMPTJOBS_DATABASE_URL or DATABASE_URL)",
        ),
        (
            "postgresql://nobody@127.0.0.1:1/x",
            "error: cannot use the database at postgresql://nobody@127.0.0.1:1/x: ",
        ),
    ],
)
@pytest.mark.parametrize(
    "command", [("jobs", "list"), ("keys", "create", "--org", "a", "--user", "b")]
)
def test_the_cli_on_a_store_that_is_not_there_says_so_in_one_line(
    tmp_path: Path, store: str, says: str, command: tuple[str, ...]
) -> None:
    answer = promptjobs(*command, database_url=store.format(tmp=tmp_path))
    assert answer.returncode == 1
    assert answer.stderr.startswith(says.format(tmp=tmp_path)), answer.stderr
    assert len(answer.stderr.splitlines()) == 1 and answer.stdout == ""
    assert not (tmp_path / "nodata").exists()  # nothing made anew
