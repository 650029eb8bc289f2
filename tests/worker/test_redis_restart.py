"""A Redis restart under a running job does not end the worker: it reconnects and keeps consuming.

A real ``redis-server`` (tests/servers.py; skipped loudly when missing, failed under
DIARIST_REQUIRE_SERVICES=1) is shut down while the worker runs a job (its message unacked) and started
again on the same port, empty, twice. Without worker/redis_broker.py the first outage ends the worker with
"Unrecoverable error: AttributeError(... 'hostname')" from kombu's ``_connparams``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery import Celery

from diarist.settings import Settings
from tests.servers import Redis
from worker import routing
from worker.celery_app import configure

pytestmark = [pytest.mark.services]


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the worker exited ({proc.returncode}) before {path.name}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {path.name} within {timeout_s} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def test_worker_survives_redis_restarts_while_running_a_job(tmp_path):
    redis = Redis()
    log = tmp_path / "worker.log"
    sender = configure(Settings(broker_url=redis.url), Celery("sender"))

    def send(name: str, seconds: float) -> None:
        sender.send_task("test.sleep_then_mark", args=[name, seconds], queue=routing.SHORT,
                         routing_key=routing.SHORT)

    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.worker.redis_restart_child", redis.url, str(tmp_path)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        for outage in ("first", "second"):
            send(outage, 4.0)
            _wait_for(tmp_path / f"{outage}.started", proc, log)
            redis.down()  # as `redis-cli shutdown nosave`: the queues are gone with it
            time.sleep(2.0)
            redis.up()
            _wait_for(tmp_path / outage, proc, log)  # the running job finished despite the outage
        # The worker reconnected and consumes again: a job sent after both restarts runs.
        send("after", 0.0)
        _wait_for(tmp_path / "after", proc, log, timeout_s=45.0)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert "Unrecoverable error" not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        redis.stop()
        sender.close()
