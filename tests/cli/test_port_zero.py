"""``--port 0``: the OS picks a free port, and the URL the command prints is the one that answers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest


def served_url(p: subprocess.Popen, timeout_s: float) -> str:
    """The ``http://...`` URL of the first ``listening on`` line ``p`` prints."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line and p.poll() is not None:
            break
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return m.group(1)
    raise AssertionError(f"no 'listening on' line (exit {p.poll()})")


@pytest.mark.parametrize(("argv", "path"), [
    (["engine", "--model", "moss-td", "--load-format", "dummy", "--dummy-config", "tiny"], "/health"),
    (["serve"], "/healthz"),
], ids=["engine", "serve"])
def test_port_zero_serves_on_the_port_it_prints(tmp_path, argv, path):
    env = {**os.environ, "DIARIST_SCRATCH_DIR": str(tmp_path / "scratch"), "DIARIST_BROKER_URL": "memory://",
           "DIARIST_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "DIARIST_STORAGE_DIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "cli", *argv, "--host", "127.0.0.1", "--port", "0"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = served_url(p, 120)
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}" and port != 0
        # no retry: both commands print the line only once they listen, so the first GET is answered
        assert httpx.get(url + path, timeout=10).status_code == 200
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out[-2000:]
