"""The embedded stack for the API tests: real engine (bundled tiny.en), real Celery in-memory broker and
in-process worker threads, SQLite, local object store, served over real HTTP on a loopback port.

One stack per test session (the engine is the session's ``whisper_engine``); tests that need other
settings build a second app over the same handles (``app_with``).
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import httpx
import pytest

FINAL = ("completed", "failed", "canceled")


@pytest.fixture(scope="session")
def stack(whisper_engine, tmp_path_factory):
    from diarist.commands.stack import EmbeddedStack, embedded_settings
    from diarist.settings import Settings

    data = tmp_path_factory.mktemp("diarist-data")
    st = embedded_settings(Settings(_env_file=None), data_dir=data, webhook_allow_hosts=["127.0.0.1"],
                           webhook_backoff_s=0.2, webhook_max_attempts=3, auth=False)
    s = EmbeddedStack(st, engine=whisper_engine, worker_concurrency=4).start()
    s.serve_in_thread()
    yield s
    s.stop()


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=120) as c:
        yield c


def wait_final(client: httpx.Client, job_id: str, timeout_s: float = 240.0, headers: dict | None = None) -> dict:
    """Poll GET /v1/jobs/{id} until a final state (the bound only guards against a hang)."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}", headers=headers or {}).json()
        if job.get("status") in FINAL or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


@pytest.fixture
def app_with(stack):
    """``app_with(**settings)``: an app with other settings over the stack's DB, store, bus and queue."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from diarist.services import Services

    clients = []

    def make(**overrides) -> TestClient:
        st = type(stack.settings).model_validate({**stack.settings.model_dump(), **overrides})
        svc = Services(settings=st, db=stack.services.db, store=stack.services.store, bus=stack.services.bus,
                       dispatcher=stack.services.dispatcher)
        c = TestClient(create_app(svc), raise_server_exceptions=False)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


class Receiver:
    """A loopback HTTP server recording webhook POSTs; answers ``codes`` in turn, then 200."""

    def __init__(self, codes: list[int] | None = None) -> None:
        self.codes = list(codes or [])
        self.calls: list[tuple[dict, bytes]] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
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


@pytest.fixture
def receiver():
    made = []

    def make(codes: list[int] | None = None) -> Receiver:
        r = Receiver(codes)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def wait_job():
    """``wait_job(client, job_id, ...)``: see :func:`wait_final`."""
    return wait_final
