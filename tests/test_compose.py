"""docker-compose.yml: every service runs a real `diarist` subcommand; the topology DESIGN.md §1 asks for."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from diarist.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_commands(compose):
    services = compose["services"]
    assert {"postgres", "redis", "minio", "migrate", "api", "engine", "worker-short", "worker-long",
            "worker-webhooks"} <= set(services)
    parser = build_parser()
    for name, svc in services.items():
        cmd = svc.get("command")
        if cmd and cmd[0] == "diarist":
            parser.parse_args(cmd[1:])  # SystemExit on an unknown subcommand or flag
    classes = {services[f"worker-{c}"]["command"][3] for c in ("short", "long", "webhooks")}
    assert classes == {"short", "long", "webhooks"}
    gpu = services["engine"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]
    for name in ("postgres", "redis", "minio", "api", "engine"):
        assert "healthcheck" in services[name], name
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_api_has_a_fixed_session_secret_and_workers_expose_metrics(compose):
    """Admin logins survive restarts and replicas only when every API process signs with one key; each
    worker's counters are scraped from its own port (two workers share the engine's network namespace)."""
    services = compose["services"]
    secret = services["api"]["environment"]["DIARIST_ADMIN_SESSION_SECRET"]
    assert secret.startswith("${DIARIST_ADMIN_SESSION_SECRET:?")  # required: no default, no random per process
    ports = []
    for c in ("short", "long", "webhooks"):
        cmd = services[f"worker-{c}"]["command"]
        ports.append(cmd[cmd.index("--metrics-port") + 1])
    assert len(set(ports)) == 3
    assert services["api"]["environment"]["DIARIST_LOG_FORMAT"] == "json"


def test_docker_compose_config_validates(compose):
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("docker compose plugin not installed")
    env = {**os.environ, "DIARIST_ADMIN_SESSION_SECRET": "x" * 64}
    subprocess.run([docker, "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"], check=True, env=env)


def test_workers_are_sized_from_the_engine_rows(compose):
    """The compose workers take their thread counts from the settings (no --concurrency), and the engine and
    the workers read the batch size from the one shared environment block."""
    from diarist.settings import Settings

    services = compose["services"]
    for c in ("short", "long"):
        assert "--concurrency" not in services[f"worker-{c}"]["command"]
    env = services["worker-short"]["environment"]
    assert services["engine"]["environment"]["DIARIST_ENGINE_MAX_RUNNING_REQUESTS"] == env[
        "DIARIST_ENGINE_MAX_RUNNING_REQUESTS"]
    st = Settings(engine_max_running_requests=int(env["DIARIST_ENGINE_MAX_RUNNING_REQUESTS"]),
                  engine_long_max_running=int(env["DIARIST_ENGINE_LONG_MAX_RUNNING"]))
    assert (st.worker_threads("short"), st.worker_threads("long")) == (80, 20)
