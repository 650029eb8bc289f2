"""Real servers on loopback for service tests: Postgres and Redis (Debian binaries), S3 (moto's server).

Each starter returns ``(url, stop)``. A missing binary skips the test with a loud reason, or fails it when
``DIARIST_REQUIRE_SERVICES=1`` (CI installs ``postgresql`` and ``redis-server`` and sets it).
"""

from __future__ import annotations

import glob
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REQUIRED = os.environ.get("DIARIST_REQUIRE_SERVICES") == "1"


def missing(what: str) -> None:
    """Skip (or fail under DIARIST_REQUIRE_SERVICES=1) because ``what`` is not installed."""
    msg = f"SERVICE TEST NOT RUN: {what} (apt-get install postgresql redis-server; see .ci/run)"
    if REQUIRED:
        pytest.fail(msg)
    pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


def start_postgres() -> tuple[str, Callable[[], None]]:
    """A throwaway cluster in a temp dir (run as user ``postgres`` when we are root: initdb refuses root)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        missing("PostgreSQL binaries (initdb, pg_ctl)")
    root = Path(tempfile.mkdtemp(prefix="diarist-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    subprocess.run([*prefix, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)
    subprocess.run([*prefix, pg_ctl, "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True)

    def stop() -> None:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True,
                       check=False)
        shutil.rmtree(root, ignore_errors=True)

    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", stop


def start_redis() -> tuple[str, Callable[[], None]]:
    exe = shutil.which("redis-server")
    if not exe:
        missing("redis-server")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)

    def stop() -> None:
        proc.terminate()
        proc.wait(timeout=10)

    return f"redis://127.0.0.1:{port}/0", stop


def start_s3() -> tuple[str, Callable[[], None]]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        missing("moto[server]")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}", server.stop


class Receiver:
    """A loopback HTTP server recording webhook POSTs; answers ``codes`` in turn, then 200."""

    def __init__(self, codes: list[int] | None = None) -> None:
        self.codes = list(codes or [])
        self.calls: list[tuple[dict, bytes]] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with outer.cond:
                    outer.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    code = outer.codes.pop(0) if outer.codes else 200
                    outer.cond.notify_all()
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait(self, n: int, timeout_s: float = 60.0) -> list[tuple[dict, bytes]]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.calls) >= n, timeout=timeout_s)
            return list(self.calls)

    def json(self, i: int) -> dict:
        return json.loads(self.calls[i][1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
