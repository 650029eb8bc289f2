"""The embedded stack for the API tests: real engine (bundled tiny.en), real Celery in-memory broker and
in-process worker threads, SQLite, local object store, served over real HTTP on a loopback port.

One stack per test module, over the session's ``whisper_engine`` (loaded once): the stack runs the engine's
loop thread only while the module runs, so engine tests that step the engine inline never race it. Tests
that need other settings build a second app over the same handles (``app_with``).
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.servers import Receiver

FINAL = ("completed", "failed", "canceled")


@pytest.fixture(scope="module")
def stack(whisper_engine, tmp_path_factory):
    from cli.commands.stack import EmbeddedStack, embedded_settings
    from diarist.settings import Settings

    data = tmp_path_factory.mktemp("diarist-data")
    st = embedded_settings(Settings(_env_file=None), data_dir=data, webhook_allow_hosts=["127.0.0.1"],
                           audio_url_allow_hosts=["127.0.0.1"],
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


def services_with(stack, **settings):
    """:class:`diarist.services.Services` with ``settings`` changed, over the stack's database, object store,
    event bus, dispatcher and voice embedder (another API process of the same deployment, with its own event counters)."""
    from diarist.services import Services

    st = type(stack.settings).model_validate({**stack.settings.model_dump(), **settings})
    return Services(settings=st, db=stack.services.db, store=stack.services.store, bus=stack.services.bus,
                    dispatcher=stack.services.dispatcher, voices=stack.services.voices)


@pytest.fixture
def app_with(stack):
    """``app_with(**settings)``: an app with other settings over the stack's DB, store, bus and queue."""
    from fastapi.testclient import TestClient

    from api.app import create_app

    clients = []

    def make(**overrides) -> TestClient:
        c = TestClient(create_app(services_with(stack, **overrides)), raise_server_exceptions=False)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


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
