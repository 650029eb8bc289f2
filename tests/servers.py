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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


class Postgres:
    """A throwaway cluster in a temp dir (run as user ``postgres`` when we are root: initdb refuses root).
    ``down()`` / ``up()`` stop and restart it on the same port with its data (fault injection)."""

    def __init__(self) -> None:
        initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not initdb or not self.pg_ctl:
            missing("PostgreSQL binaries (initdb, pg_ctl)")
        self.root = Path(tempfile.mkdtemp(prefix="diarist-pg-"))
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data, self.port = self.root / "data", free_port()
        subprocess.run([*self.prefix, initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True)
        self.up()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def up(self) -> None:
        subprocess.run([*self.prefix, self.pg_ctl, "-D", str(self.data), "-w", "-l", str(self.root / "log"), "-o",
                        (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                        "-c max_connections=300"), "start"], check=True, capture_output=True)

    def down(self) -> None:
        """Stop at once (``-m immediate``: connections are cut like a crashed or unplugged server)."""
        subprocess.run([*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True, check=False)

    def stop(self) -> None:
        self.down()
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> tuple[str, Callable[[], None]]:
    """``(url, stop)`` of a new :class:`Postgres`."""
    pg = Postgres()
    return pg.url, pg.stop


class Redis:
    """``redis-server`` on a loopback port without persistence: ``down()`` / ``up()`` restart it on the
    same port, empty (as a restarted Redis without a dump loses every queue)."""

    def __init__(self) -> None:
        self.exe = shutil.which("redis-server")
        if not self.exe:
            missing("redis-server")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.up()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def up(self) -> None:
        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def down(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def start_redis() -> tuple[str, Callable[[], None]]:
    """``(url, stop)`` of a new :class:`Redis`."""
    r = Redis()
    return r.url, r.stop


class S3:
    """moto's S3 server in this process; ``down()`` / ``up()`` take the endpoint away and back on the same
    port (the buckets live in moto's in-process backend, so they survive)."""

    def __init__(self) -> None:
        try:
            from moto.server import ThreadedMotoServer  # noqa: F401
        except ImportError:
            missing("moto[server]")
        self.port = free_port()
        self.server = None
        self.up()
        self.url = f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        wait_port(self.port)

    def down(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    stop = down


def start_s3() -> tuple[str, Callable[[], None]]:
    """``(url, stop)`` of a new :class:`S3`."""
    s3 = S3()
    return s3.url, s3.stop


@contextmanager
def serve_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) in a daemon thread until the block exits; yields the
    base URL (``http://127.0.0.1:PORT``)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler for loopback stand-ins: logs no request lines (they would flood the test output) and
    answers with :meth:`reply`."""

    def reply(self, status: int, body: bytes = b"", content_type: str | None = None) -> None:
        """Send ``status`` with ``body``, its ``content-length`` and, when given, its ``content-type``."""
        self.send_response(status)
        if content_type is not None:
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class Receiver:
    """A loopback HTTP server recording webhook POSTs; answers ``codes`` in turn, then 200."""

    def __init__(self, codes: list[int] | None = None) -> None:
        self.codes = list(codes or [])
        self.calls: list[tuple[dict, bytes]] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with outer.cond:
                    outer.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    code = outer.codes.pop(0) if outer.codes else 200
                    outer.cond.notify_all()
                self.reply(code)

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
