"""The page's static files: every ES module the page imports is one the API serves, as
JavaScript (a browser refuses a module script of any other type), and nothing else is."""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.routes import page
from api.routes.page import ASSETS, STATIC
from projections.domain.lifecycle import OUTPUT_STATES, JobState

# `import { a, b } from "./x.js";` — the only form the page's modules use.
IMPORT = re.compile(r'^import\s[^;]*?\sfrom\s"\./([^"]+)";', re.MULTILINE)


def imports(name: str) -> set[str]:
    return set(IMPORT.findall((STATIC / name).read_text()))


def test_every_static_file_is_listed_and_every_listed_file_exists() -> None:
    on_disk = {path.name for path in STATIC.iterdir() if path.is_file()}
    assert on_disk - {"index.html"} == set(ASSETS)


def test_index_loads_app_js_as_a_module() -> None:
    html = (STATIC / "index.html").read_text()
    assert '<script type="module" src="/static/app.js"></script>' in html


def test_the_modules_app_js_reaches_are_exactly_the_served_scripts() -> None:
    reached: set[str] = set()
    pending = ["app.js"]
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        reached.add(name)
        assert name in ASSETS, f"a module imports {name!r}, which the API does not serve"
        pending.extend(imports(name))
    scripts = {name for name in ASSETS if name.endswith(".js")}
    assert reached == scripts, f"served but never imported: {sorted(scripts - reached)}"


def test_scripts_are_served_as_javascript() -> None:
    app = FastAPI()
    app.include_router(page.router)
    with TestClient(app) as client:
        for name, media_type in ASSETS.items():
            response = client.get(f"/static/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"].startswith(media_type), name
            if name.endswith(".js"):
                assert media_type == "text/javascript", name
                assert response.headers["x-content-type-options"] == "nosniff"


def test_the_pages_state_sets_are_the_lifecycles() -> None:
    """The page spells three sets of states in JavaScript; each is the lifecycle's."""
    source = (STATIC / "jobs.js").read_text()

    def spelt(name: str) -> set[str]:
        found = re.search(rf"const {name} = new Set\(\[([^\]]*)\]\);", source)
        assert found is not None, name
        return set(re.findall(r'"([a-z_]+)"', found.group(1)))

    assert spelt("IN_FLIGHT") == {state.value for state in JobState if state.is_cancelable()}
    assert spelt("RETRYABLE") == {s.value for s in JobState if s.is_retryable_by_user()}
    assert spelt("OUTPUT_STATES") == {state.value for state in OUTPUT_STATES}
