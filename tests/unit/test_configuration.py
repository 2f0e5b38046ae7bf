"""Settings from the environment, and the configuration reference that documents them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from promptjobs import settings_doc
from promptjobs.runtime import temporal_tls
from promptjobs.settings import Settings
from tests.integration.processes import PROMPTJOBS


def test_every_setting_is_documented_in_the_configuration_reference() -> None:
    doc = settings_doc.DOC.read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} needs a docstring"
        for variable in settings_doc.variables(name, field):
            assert f"`{variable}`" in doc, f"docs/configuration.md lacks {variable}"
    assert settings_doc.render(doc) == doc, (
        "docs/configuration.md is stale: run python -m promptjobs.settings_doc --write"
    )


def test_database_url_is_read_from_either_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/conventional")
    assert Settings().projection_url == "postgresql://db/conventional"
    monkeypatch.setenv("PROMPTJOBS_DATABASE_URL", "postgresql://db/ours")
    assert Settings().projection_url == "postgresql://db/ours"


def test_temporal_tls_from_certificate_paths(tmp_path: Path) -> None:
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_bytes(f"{name} pem".encode())
    settings = Settings(
        temporal_tls_ca_path=tmp_path / "ca.pem",
        temporal_tls_cert_path=tmp_path / "cert.pem",
        temporal_tls_key_path=tmp_path / "key.pem",
        temporal_tls_server_name="temporal.internal",
    )
    assert temporal_tls(settings) == TLSConfig(
        server_root_ca_cert=b"ca pem",
        domain="temporal.internal",
        client_cert=b"cert pem",
        client_private_key=b"key pem",
    )
    assert temporal_tls(Settings()) is False
    assert temporal_tls(Settings(temporal_api_key="secret")) == TLSConfig()


def test_a_client_certificate_without_its_key_is_refused_at_start(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PROMPTJOBS_TEMPORAL_TLS_CERT_PATH": str(tmp_path / "c.pem")}
    result = subprocess.run(
        [PROMPTJOBS, "worker"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "PROMPTJOBS_TEMPORAL_TLS_KEY_PATH" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_fake_provider_is_off_by_default_and_no_job_falls_back_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("FAKE_ADAPTER", "DEFAULT_PROVIDER", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(f"PROMPTJOBS_{name}", raising=False)
    assert Settings(_env_file=None).fake_adapter is False  # type: ignore[call-arg]
    assert Settings(_env_file=None).provider_default == "openai"  # type: ignore[call-arg]
    assert Settings(anthropic_api_key="k").provider_default == "anthropic"
    assert Settings(anthropic_api_key="k", openai_api_key="k").provider_default == "openai"
    monkeypatch.setenv("PROMPTJOBS_FAKE_ADAPTER", "true")
    assert Settings().provider_default == "fake"
    assert Settings(default_provider="anthropic").provider_default == "anthropic"


def test_settings_given_to_a_child_process_are_the_same_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`promptjobs dev` starts its worker with `Settings.environment()`: read back from the
    environment, they are the settings it had, secrets and aliases included."""
    given = Settings(
        data_dir=tmp_path,
        database_url="postgresql://u:secret@db:5432/p",
        fake_adapter=True,
        openai_api_key="sk-test",  # type: ignore[arg-type]
        heartbeat_timeout_s=2.5,
        otel_traces_exporter="console",
        default_provider="fake",
    )
    for name in list(os.environ):
        if name.startswith(("PROMPTJOBS_", "OTEL_")) or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    for name, value in given.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # no .env file of the checkout
    assert Settings() == given
