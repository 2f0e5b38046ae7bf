"""docker-compose.yml and the Dockerfile, checked as far as this machine can without Docker.

The file parses; the promptjobs commands and settings it uses exist; addresses, credentials,
ports and versions agree between services; the worker can scale; the files the Dockerfile and
the compose file reference exist; and the one-shot that registers the search attributes works
against a real Temporal server.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from sqlalchemy.engine import make_url
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from promptjobs import settings_doc
from promptjobs.cli import app
from promptjobs.runtime import temporal_cli
from promptjobs.settings import Settings
from services.dispatch import PRIORITY_LEVELS
from tests.conftest import free_port
from workflows import search_attributes

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?::-(?P<default>[^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose's `${NAME:-default}` with nothing set; every variable must have a default so
    `docker compose up` works without a .env file."""
    if isinstance(value, str):

        def default(match: re.Match[str]) -> str:
            assert match["default"] is not None, f"${{{match['name']}}} has no default"
            return match["default"]

        return VARIABLE.sub(default, value)
    if isinstance(value, dict):
        return {key: interpolate(item) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item) for item in value]
    return value


COMPOSE: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE_FILE.read_text()))
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# Ours: built from the Dockerfile in this repository.
OURS = {name: service for name, service in SERVICES.items() if "build" in service}
ONE_SHOT = {"temporal-schema", "temporal-setup"}


def env(service: str) -> dict[str, str]:
    environment = SERVICES[service].get("environment", {})
    assert isinstance(environment, dict), f"{service}: write environment as a mapping"
    return {key: str(value) for key, value in environment.items()}


def container_ports(service: str) -> list[int]:
    return [int(str(mapping).rsplit(":", 1)[1]) for mapping in SERVICES[service].get("ports", [])]


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, duration
    return int(match[1]) * (60 if match[2] == "m" else 1)


def test_the_production_shape_is_all_there() -> None:
    assert set(SERVICES) == {
        "postgresql",
        "temporal-schema",
        "temporal",
        "temporal-setup",
        "temporal-ui",
        "api",
        "worker",
        "prometheus",
        "grafana",
    }
    assert set(OURS) == {"api", "worker"}
    # Observability is opt-in: `docker compose up` alone starts none of it.
    optional = {name for name, service in SERVICES.items() if service.get("profiles")}
    assert optional == {"prometheus", "grafana"}
    assert all(SERVICES[name]["profiles"] == ["observability"] for name in optional)
    for name, service in SERVICES.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
        restart = service["restart"]
        if name in ONE_SHOT:
            assert restart.startswith("on-failure"), name
        else:
            assert restart == "unless-stopped", name
    for name in ("postgresql", "temporal", "api"):
        assert "healthcheck" in SERVICES[name], name
    # The API and the workers wait for a healthy database and a fully set-up Temporal.
    for name in OURS:
        assert SERVICES[name]["depends_on"] == {
            "postgresql": {"condition": "service_healthy"},
            "temporal-setup": {"condition": "service_completed_successfully"},
        }


def test_images_are_pinned_and_temporal_versions_agree() -> None:
    tags = {}
    for name, service in SERVICES.items():
        image, _, tag = service["image"].rpartition(":")
        assert image and tag and tag != "latest", f"{name}: pin {service['image']}"
        tags[image] = tag
    assert tags["temporalio/server"] == tags["temporalio/admin-tools"]
    # Our two roles are one image.
    assert len({service["image"] for service in OURS.values()}) == 1


def test_every_promptjobs_command_it_runs_exists() -> None:
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", DOCKERFILE.read_text(), re.M)
    default = re.search(r"^CMD (.+)$", DOCKERFILE.read_text(), re.M)
    assert entrypoint and default
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert yaml.safe_load(entrypoint[1]) == ["promptjobs"]
    assert "promptjobs" in scripts
    commands = [yaml.safe_load(default[1])] + [service["command"] for service in OURS.values()]
    runner = CliRunner()
    for command in commands:
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, (command, result.output)


def test_every_environment_variable_it_sets_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    known = {
        variable
        for name, field in Settings.model_fields.items()
        for variable in settings_doc.variables(name, field)
    }
    for name in OURS:
        unknown = set(env(name)) - known
        assert not unknown, f"{name} sets {unknown}, which no setting reads"
        # And the values are valid settings.
        for variable in list(os.environ):
            if variable.startswith("PROMPTJOBS_") or variable == "DATABASE_URL":
                monkeypatch.delenv(variable)
        for variable, value in env(name).items():
            monkeypatch.setenv(variable, value)
        Settings()


def test_addresses_credentials_and_ports_agree() -> None:
    api, postgres, temporal = env("api"), env("postgresql"), env("temporal")
    assert env("worker").items() <= api.items(), "the workers and the API share their config"

    database = make_url(api["PROMPTJOBS_DATABASE_URL"])
    assert database.get_backend_name() == "postgresql"
    assert database.host == "postgresql" and (database.port or 5432) == 5432
    assert database.username == postgres["POSTGRES_USER"]
    assert database.password == postgres["POSTGRES_PASSWORD"]
    assert database.database == postgres["POSTGRES_DB"]
    for name in ("temporal", "temporal-schema"):
        other = env(name)
        assert other["POSTGRES_SEEDS"] == "postgresql" and other["DB_PORT"] == "5432"
        assert other["POSTGRES_USER"] == postgres["POSTGRES_USER"]
        assert other["POSTGRES_PWD"] == postgres["POSTGRES_PASSWORD"]
        assert (other["DBNAME"], other["VISIBILITY_DBNAME"]) == (
            temporal["DBNAME"],
            temporal["VISIBILITY_DBNAME"],
        )
    # Temporal's own databases are not the projection's.
    assert database.database not in (temporal["DBNAME"], temporal["VISIBILITY_DBNAME"])

    host, port = api["PROMPTJOBS_TEMPORAL_ADDRESS"].rsplit(":", 1)
    assert host == "temporal" and int(port) in container_ports("temporal")
    assert "7233" in SERVICES["temporal"]["healthcheck"]["test"]
    assert env("temporal-setup")["TEMPORAL_ADDRESS"] == api["PROMPTJOBS_TEMPORAL_ADDRESS"]
    assert env("temporal-ui")["TEMPORAL_ADDRESS"] == api["PROMPTJOBS_TEMPORAL_ADDRESS"]
    namespace = api["PROMPTJOBS_TEMPORAL_NAMESPACE"]
    assert env("temporal-setup")["NAMESPACE"] == namespace
    assert env("temporal-ui")["TEMPORAL_DEFAULT_NAMESPACE"] == namespace

    api_port = int(api["PROMPTJOBS_API_PORT"])
    assert api["PROMPTJOBS_API_HOST"] == "0.0.0.0"
    assert container_ports("api") == [api_port]
    probe = " ".join(SERVICES["api"]["healthcheck"]["test"])
    url = urlsplit(re.search(r"http://[^'\" ]+", probe)[0])  # type: ignore[index]
    assert (url.port, url.path) == (api_port, "/readyz")
    assert f"EXPOSE {api_port}" in DOCKERFILE.read_text()
    # The UI listens on 8080 in its image; the host sees it where `promptjobs dev` puts it.
    assert SERVICES["temporal-ui"]["ports"] == [f"127.0.0.1:{Settings().temporal_ui_port}:8080"]


def test_the_worker_can_scale() -> None:
    worker = SERVICES["worker"]
    assert "container_name" not in worker, "a fixed name allows one container only"
    assert "ports" not in worker, "a host port allows one container only"
    assert "deploy" not in worker or "replicas" not in worker["deploy"]


def test_docker_stop_waits_longer_than_the_shutdown_grace() -> None:
    for name in OURS:
        grace = float(env(name)["PROMPTJOBS_SHUTDOWN_GRACE_S"])
        assert seconds(SERVICES[name]["stop_grace_period"]) >= grace + 10, name


def test_the_files_it_mounts_exist() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).is_file(), f"{name} mounts missing {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
        command = service.get("command", [])
        for script in [part for part in command if part.startswith("/setup/")]:
            mounts = [v.split(":")[1] for v in service["volumes"]]
            assert script in mounts, f"{name} runs {script}, which it does not mount"
    dynamic = env("temporal")["DYNAMIC_CONFIG_FILE_PATH"]
    mounts = [v.split(":")[1] for v in SERVICES["temporal"]["volumes"]]
    assert f"/etc/temporal/{dynamic}" in mounts
    config = yaml.safe_load((ROOT / "deploy/temporal/dynamicconfig.yaml").read_text())
    assert all(isinstance(v, list) and "value" in v[0] for v in config.values())
    # One Temporal priority key per priority 0…100, as the dispatcher maps them.
    assert config["matching.priorityLevels"][0]["value"] == PRIORITY_LEVELS


def test_the_dockerfile_copies_every_package_and_only_files_that_exist() -> None:
    text = DOCKERFILE.read_text()
    copied: list[str] = []
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _destination = [part for part in line.split() if not part.startswith("--")]
        copied += sources
    for source in copied:
        assert (ROOT / source).exists(), f"the Dockerfile copies missing {source}"
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not ignored & set(copied), "a copied path is excluded by .dockerignore"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert set(packages) <= set(copied), "a package is missing from the image"
    version = re.search(r"^FROM python:(\d+)\.(\d+)", text, re.M)
    assert version, "the image builds on the official python image"
    wanted = re.fullmatch(r">=(\d+)\.(\d+)", project["project"]["requires-python"])
    assert wanted and (int(version[1]), int(version[2])) >= (int(wanted[1]), int(wanted[2]))


async def test_the_setup_one_shot_registers_the_workflows_search_attributes(
    tmp_path: Path,
) -> None:
    """Run the temporal-setup service's script, with the same `temporal` CLI the admin-tools
    image ships, against a real server: a new namespace gets every attribute, twice over."""
    server = await WorkflowEnvironment.start_local(
        port=free_port(), dev_server_existing_path=temporal_cli(), dev_server_log_level="error"
    )
    try:
        setup = env("temporal-setup")
        namespace = "promptjobs-compose"
        script_env = {
            **setup,
            "PATH": f"{Path(temporal_cli()).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TEMPORAL_ADDRESS": server.client.service_client.config.target_host,
            "NAMESPACE": namespace,
        }
        script = ROOT / "deploy/temporal/setup-namespace.sh"
        for _ in range(2):  # a second `docker compose up` runs it again
            proc = await asyncio.create_subprocess_exec(
                "sh",
                str(script),
                env=script_env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                output, _ = await asyncio.wait_for(proc.communicate(), 90)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0, output.decode()
        listed = await server.client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        assert dict(listed.custom_attributes) == {
            key.name: int(key.indexed_value_type) for key in search_attributes.ALL
        }
    finally:
        await server.shutdown()


# -- the observability profile ------------------------------------------------------------

DASHBOARD = ROOT / "deploy/grafana/dashboards/promptjobs.json"
# What is not a series name in a PromQL expression: grouping, label matchers, ranges.
PROMQL_NOT_NAMES = re.compile(r"\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}|\[[^\]]*\]")
PROMQL_FUNCTIONS = {"sum", "rate", "histogram_quantile", "avg", "max", "min", "increase"}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def our_metric_names() -> set[str]:
    """Every series name this code exports: our registry's, and the Temporal SDK's worker
    metrics the worker's port serves (checked against a real scrape in
    test_worker_observability.py)."""
    from prometheus_client import REGISTRY

    import projections.metrics
    from promptjobs.observability import SDK_WORKER_METRICS

    names = {sample.name for family in REGISTRY.collect() for sample in family.samples} | {
        family.name for family in REGISTRY.collect()
    }
    for family in projections.metrics.ALL:
        names |= {family._name + suffix for suffix in ("", "_total", *HISTOGRAM_SUFFIXES)}
    for name in SDK_WORKER_METRICS:
        names |= {name, *(name + suffix for suffix in HISTOGRAM_SUFFIXES)}
    return names


def test_the_dashboard_is_valid_and_queries_only_metrics_we_export() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    exported = our_metric_names()
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for wanted in ("state", "submissions", "error", "latency", "backlog", "slots"):
        assert wanted in titles, f"no panel about {wanted}"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "prometheus"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            bare = PROMQL_NOT_NAMES.sub(" ", target["expr"])
            names = set(re.findall(r"\b[a-z_][a-z0-9_]*\b", bare)) - PROMQL_FUNCTIONS
            assert names, target["expr"]
            unknown = names - exported
            assert not unknown, f"{panel['title']}: {unknown} is not a metric we export"


def test_prometheus_scrapes_the_api_every_worker_and_temporal_where_they_listen() -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api_port = env("api")["PROMPTJOBS_API_PORT"]
    assert jobs["promptjobs-api"]["static_configs"][0]["targets"] == [f"api:{api_port}"]
    # DNS discovery: every container of the scaled worker service.
    (discovery,) = jobs["promptjobs-worker"]["dns_sd_configs"]
    assert discovery["names"] == ["worker"]
    assert str(discovery["port"]) == env("worker")["PROMPTJOBS_WORKER_METRICS_PORT"]
    assert env("worker")["PROMPTJOBS_WORKER_METRICS_HOST"] == "0.0.0.0"
    temporal_port = env("temporal")["PROMETHEUS_ENDPOINT"].rsplit(":", 1)[1]
    assert jobs["temporal"]["static_configs"][0]["targets"] == [f"temporal:{temporal_port}"]
    datasource = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["uid"] == "prometheus"
    assert urlsplit(datasource["url"]).port in container_ports("prometheus")
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/promptjobs.yml").read_text()
    )["providers"][0]
    mounts = [v.split(":")[1] for v in SERVICES["grafana"]["volumes"]]
    assert f"{provider['options']['path']}/promptjobs.json" in mounts
