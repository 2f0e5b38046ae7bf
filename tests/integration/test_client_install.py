"""The Python client installs alone: `pip install clients/python` into an empty virtualenv
brings httpx, httpx-sse and pydantic, none of the server (FastAPI, SQLAlchemy, temporalio,
the provider SDKs), and that client submits a job to the live API and follows it to its end."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import venv
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from tests.conftest import Stack, make_settings, running_stack

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
SERVER_ONLY = ["fastapi", "sqlalchemy", "temporalio", "openai", "anthropic", "promptjobs"]

USE = """
import importlib.util, json, os
from promptjobs_client import PromptJobs
absent = [name for name in json.loads(os.environ["SERVER_ONLY"]) if importlib.util.find_spec(name)]
with PromptJobs() as client:
    job = client.submit("hello from an empty virtualenv")
    done = job.wait(timeout=60)
    print(json.dumps({"absent": absent, "state": done.state, "text": job.response().text}))
"""


def install_alone(where: Path) -> Path:
    venv.create(where / "venv", with_pip=True)
    python = where / "venv" / "bin" / "python"
    # From a copy: pip builds in the source folder, which is not to be written in.
    source = shutil.copytree(CLIENT, where / "client", ignore=shutil.ignore_patterns("build"))
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return python


async def test_the_client_installs_alone_and_follows_a_job(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    python = await asyncio.to_thread(install_alone, tmp_path)
    settings = make_settings(tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}")
    async with running_stack(settings, dev_server.client) as stack:
        said = await asyncio.to_thread(use_alone, python, stack, tmp_path)
    assert said["absent"] == []  # none of the server's packages is there
    assert said["state"] == "succeeded" and said["text"].startswith("[fake:")


def use_alone(python: Path, stack: Stack, cwd: Path) -> Any:
    env = {
        "PROMPTJOBS_URL": stack.base_url,
        "PROMPTJOBS_API_KEY": stack.api_key,
        "SERVER_ONLY": json.dumps(SERVER_ONLY),
        "PATH": "/usr/bin:/bin",
    }
    # Away from the checkout, whose packages `python -c` would otherwise find in its folder.
    ran = subprocess.run(
        [python, "-c", USE], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)
