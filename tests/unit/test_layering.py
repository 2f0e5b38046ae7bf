"""The packages' layering. The operator CLI acts through services/ and never loads the HTTP
layer (issue 15): no FastAPI, uvicorn or SSE, none of api/'s app, routes or stream feed. It
shares only api/schemas.py's request models (pure pydantic), to validate a retry as the API
does. And imports run one way, as the README's map says."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

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


# The README's import map, top to bottom: a package imports only those below it (and the
# shell imports the API, whose app it builds).
LAYERS = {
    "api": 0, "promptjobs": 0, "services": 1, "workflows": 2, "activities": 3, "projections": 4,
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]


def imported_packages(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name.split(".")[0] for name in names}


def test_no_package_imports_one_above_it() -> None:
    upward = [
        f"{path.relative_to(ROOT)} imports {package}"
        for layer, rank in LAYERS.items()
        for path in (ROOT / layer).rglob("*.py")
        for package in imported_packages(path)
        if package in LAYERS
        and package != layer
        and LAYERS[package] <= rank
        and not (layer == "promptjobs" and package == "api")
    ]
    assert upward == []


def test_the_pure_domain_imports_no_storage_and_nothing_else_of_ours() -> None:
    """projections/domain/: the lifecycle and the chains' placeholders decide for every
    layer, the workflow's sandbox included; they import the standard library and each other."""
    allowed_ours = {"projections"}
    for path in (ROOT / "projections" / "domain").rglob("*.py"):
        imported = imported_packages(path)
        assert imported & set(LAYERS) <= allowed_ours, (path.name, imported)
        third_party = (
            {name for name in imported if name not in sys.stdlib_module_names}
            - allowed_ours
            - {"__future__"}
        )
        assert third_party == set(), (path.name, third_party)
        text = path.read_text()
        assert "from projections." not in text.replace("from projections.domain", ""), path.name


def module_imports(path: Path) -> set[str]:
    """Our modules `path` imports (at any place in it, under TYPE_CHECKING too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Within the layers too, imports run one way: a circle (even a type-only one) is two
    modules that want to be one, or a part that wants to be handed what it uses."""
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for layer in LAYERS
        for path in (ROOT / layer).rglob("*.py")
    }
    graph = {
        name: {other for other in module_imports(path) if other in modules and other != name}
        for name, path in modules.items()
    }
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append([*trail[trail.index(name) :], name])
            return
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert circles == [], [" → ".join(circle) for circle in circles]


def test_the_pages_scripts_import_in_one_direction() -> None:
    """api/static/*.js modules: no two import each other, however far round."""
    import re

    static = ROOT / "api" / "static"
    graph = {
        path.name: set(re.findall(r"""from\s+["']\./([\w-]+\.js)["']""", path.read_text()))
        for path in static.glob("*.js")
    }
    circles = []
    for start in graph:
        seen, stack = set(), [(start, [start])]
        while stack:
            name, trail = stack.pop()
            for other in graph.get(name, ()):
                if other == start:
                    circles.append(" → ".join([*trail, other]))
                elif other not in seen:
                    seen.add(other)
                    stack.append((other, [*trail, other]))
    assert circles == [], circles
