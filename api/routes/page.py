"""The Now Session: the browser page at `/` for submitting prompts and following their jobs."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.problems import Problem

router = APIRouter(include_in_schema=False)

STATIC = Path(__file__).resolve().parent.parent / "static"

# Only these files are served: a name from the URL never becomes a path on its own. The
# scripts are ES modules (app.js imports the rest), which a browser runs only when served
# with a JavaScript type.
ASSETS = {
    "app.js": "text/javascript",
    "state.js": "text/javascript",
    "api.js": "text/javascript",
    "jobs.js": "text/javascript",
    "cards.js": "text/javascript",
    "actions.js": "text/javascript",
    "compose.js": "text/javascript",
    "follow.js": "text/javascript",
    "app.css": "text/css",
}

# The page loads nothing but its own files and talks only to this API.
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/")
async def now_session() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=HEADERS)


@router.get("/static/{name}")
async def asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise Problem(404, "not_found", "Not found", f"no static file {name!r}")
    return FileResponse(STATIC / name, media_type=media_type, headers=HEADERS)
