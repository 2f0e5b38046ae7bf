"""The operator CLI acts through services/ and never loads the HTTP layer (issue 15): no
FastAPI, uvicorn or SSE, none of api/'s app, routes or stream feed. It shares only
api/schemas.py's request models (pure pydantic), to validate a retry as the API does."""

from __future__ import annotations

import json
import subprocess
import sys

HTTP_PACKAGES = ("fastapi", "uvicorn", "starlette", "sse_starlette")
SHARED_MODELS = {"api", "api.schemas"}


def test_the_operator_commands_load_nothing_of_the_http_layer() -> None:
    probe = (
        "import json, sys\n"
        "import promptjobs.cli_jobs, promptjobs.cli_orgs, promptjobs.console, promptjobs.wiring\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout
    )
    http = [m for m in loaded if m.split(".")[0] in HTTP_PACKAGES]
    ours = [m for m in loaded if (m == "api" or m.startswith("api.")) and m not in SHARED_MODELS]
    assert http == [] and ours == [], (http[:5], ours)
