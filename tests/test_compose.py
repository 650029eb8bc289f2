"""docker-compose.yml: every service runs a real `diarist` subcommand; the topology docs/service.md describes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_commands(compose):
    services = compose["services"]
    assert {"postgres", "redis", "minio", "migrate", "api", "gpu-node", "engine-0", "engine-1", "worker-short-0",
            "worker-long-0", "worker-short-1", "worker-long-1", "worker-webhooks"} <= set(services)
    parser = build_parser()
    for name, svc in services.items():
        cmd = svc.get("command")
        if cmd and cmd[0] == "diarist":
            parser.parse_args(cmd[1:])  # SystemExit on an unknown subcommand or flag
    classes = {services[w]["command"][3] for w in ("worker-short-0", "worker-long-1", "worker-webhooks")}
    assert classes == {"short", "long", "webhooks"}
    for name in ("postgres", "redis", "minio", "api", "engine-0", "engine-1"):
        assert "healthcheck" in services[name], name
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_one_engine_per_gpu_and_a_worker_set_per_engine(compose):
    """Two GPUs: each engine reserves its own GPU and listens on its own loopback port; each engine has a
    short and a long worker whose engine list names it first and the other engine after it (failover);
    engines and workers share gpu-node's network namespace, so every engine is on their loopback."""
    from diarist.urls import parse_engine_urls

    services = compose["services"]
    ports, gpus = {}, {}
    for i in (0, 1):
        eng = services[f"engine-{i}"]
        cmd = eng["command"]
        ports[i] = cmd[cmd.index("--port") + 1]
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
        (dev,) = eng["deploy"]["resources"]["reservations"]["devices"]
        assert dev["capabilities"] == ["gpu"]
        gpus[i] = dev["device_ids"]
        assert ports[i] in str(eng["healthcheck"]["test"])
    assert gpus == {0: ["0"], 1: ["1"]} and len(set(ports.values())) == 2
    for i, other in ((0, 1), (1, 0)):
        for c in ("short", "long"):
            w = services[f"worker-{c}-{i}"]
            urls = parse_engine_urls(w["environment"]["DIARIST_ENGINE_URL"])
            assert urls == [f"http://127.0.0.1:{ports[i]}", f"http://127.0.0.1:{ports[other]}"], (i, c)
            assert w["network_mode"] == "service:gpu-node"
            assert w["depends_on"][f"engine-{i}"]["condition"] == "service_healthy"
        assert services[f"engine-{i}"]["network_mode"] == "service:gpu-node"
    assert services["gpu-node"]["command"] == ["sleep", "infinity"] and "network_mode" not in services["gpu-node"]


def test_api_has_a_fixed_session_secret_and_workers_expose_metrics(compose):
    """Admin logins survive restarts and replicas only when every API process signs with one key; each
    worker's counters are scraped from its own port (two workers share the engine's network namespace)."""
    services = compose["services"]
    secret = services["api"]["environment"]["DIARIST_ADMIN_SESSION_SECRET"]
    assert secret.startswith("${DIARIST_ADMIN_SESSION_SECRET:?")  # required: no default, no random per process
    ports = []
    workers = [n for n in services if n.startswith("worker-")]
    for w in workers:
        cmd = services[w]["command"]
        ports.append(cmd[cmd.index("--metrics-port") + 1])
    assert len(workers) == 5 and len(set(ports)) == 5  # four of them share gpu-node's network namespace
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
    for w in ("worker-short-0", "worker-long-0", "worker-short-1", "worker-long-1"):
        assert "--concurrency" not in services[w]["command"]
    env = services["worker-short-0"]["environment"]
    for e in ("engine-0", "engine-1"):
        assert services[e]["environment"]["DIARIST_ENGINE_MAX_RUNNING_REQUESTS"] == env[
            "DIARIST_ENGINE_MAX_RUNNING_REQUESTS"]
    st = Settings(engine_max_running_requests=int(env["DIARIST_ENGINE_MAX_RUNNING_REQUESTS"]),
                  engine_long_max_running=int(env["DIARIST_ENGINE_LONG_MAX_RUNNING"]))
    assert (st.worker_threads("short"), st.worker_threads("long")) == (80, 20)
