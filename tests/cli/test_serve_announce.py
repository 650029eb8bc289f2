"""``diarist serve`` prints "listening on" only once the app serves: after its lifespan startup, with the
socket listening, and never after a failed startup (a script that waits for the line must be able to
connect at once)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from cli.listen import bind_listen
from cli.serving import AnnouncingServer, announce_when_answering
from tests.cli.test_port_zero import served_url


def app_with(startup: Callable[[], Awaitable[None]]) -> Starlette:
    """An app with a liveness route whose lifespan startup is ``startup``."""

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await startup()
        yield

    return Starlette(routes=[Route("/healthz", lambda _r: PlainTextResponse("ok"))], lifespan=lifespan)


async def nothing() -> None:
    pass


async def fail() -> None:
    raise RuntimeError("the database is down")


def server_of(app: Starlette, on_started: Callable[[], None]) -> AnnouncingServer:
    return AnnouncingServer(uvicorn.Config(app, lifespan="on", log_config=None, log_level="critical"), on_started)


def test_a_failed_startup_is_never_announced():
    sock = bind_listen("127.0.0.1", 0)
    announced: list[bool] = []
    server = server_of(app_with(fail), lambda: announced.append(True))
    try:
        with pytest.raises(SystemExit) as e:  # uvicorn's STARTUP_FAILURE
            server.run(sockets=[sock])
    finally:
        sock.close()
    assert e.value.code == 3 and announced == [] and not server.started


def test_the_announcement_follows_startup_and_the_port_answers():
    entered, release = threading.Event(), threading.Event()

    async def slow() -> None:
        entered.set()
        await asyncio.to_thread(release.wait, 60)

    sock = bind_listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    announced: list[bool] = []

    def on_started() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # refused unless it listens
            announced.append(server.started)

    server = server_of(app_with(slow), on_started)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert entered.wait(60)
        assert announced == []  # the startup has not returned: nothing may be announced yet
        with pytest.raises(ConnectionRefusedError):  # and nothing listens during startup
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        release.set()
        deadline = time.monotonic() + 60
        while not announced and time.monotonic() < deadline:
            time.sleep(0.02)
        assert announced == [True]
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).text == "ok"
    finally:
        release.set()
        server.should_exit = True
        thread.join(60)
        sock.close()


def test_serve_with_a_failing_startup_prints_no_line(capsys, monkeypatch):
    from cli.main import main

    monkeypatch.setattr("cli.commands.serve.create_api", lambda: app_with(fail))
    monkeypatch.setenv("DIARIST_EMBEDDED", "false")
    with pytest.raises(SystemExit) as e:  # uvicorn's STARTUP_FAILURE, after it logged why
        main(["serve", "--host", "127.0.0.1", "--port", "0"])
    out, _ = capsys.readouterr()
    assert e.value.code == 3 and "listening on" not in out, out


def test_the_workers_line_waits_for_an_answer(capsys):
    """``--workers N``: the supervisor's socket listens before a child has the app, so the line waits for an
    HTTP answer of the liveness route."""
    sock = bind_listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    announcer = announce_when_answering(f"http://127.0.0.1:{port}/healthz", "up", interval_s=0.05)
    time.sleep(0.3)  # a few refused polls
    assert announcer.is_alive() and capsys.readouterr().out == ""
    server = server_of(app_with(nothing), lambda: None)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        announcer.join(60)
        assert not announcer.is_alive() and capsys.readouterr().out == "up\n"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one", "workers"])
def test_serve_answers_as_soon_as_it_prints(tmp_path, workers):
    """The first GET after the line answers, with no retry (the line used to come before the app started)."""
    env = {**os.environ, "DIARIST_SCRATCH_DIR": str(tmp_path / "scratch"), "DIARIST_BROKER_URL": "memory://",
           "DIARIST_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "DIARIST_STORAGE_DIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--host", "127.0.0.1", "--port", "0", *workers],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = served_url(p, 120)
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out[-2000:]


def test_create_api_builds_the_split_deployments_app(monkeypatch, tmp_path):
    """``diarist serve`` without ``--embedded`` (one uvicorn process per API worker) builds its app from the
    settings: the engine client for enrollment samples included (a trial found it refused at start)."""
    from cli.commands.serve import create_api
    from engine_server.client import HttpEngineClient

    for k, v in {"DIARIST_DATA_DIR": str(tmp_path), "DIARIST_BROKER_URL": "filesystem://",
                 "DIARIST_ENGINE_URL": "http://127.0.0.1:9", "DIARIST_MODEL": "whisper"}.items():
        monkeypatch.setenv(k, v)
    app = create_api()
    voices = app.state.services.voices
    assert isinstance(voices, HttpEngineClient) and voices.url == "http://127.0.0.1:9"
