"""The synchronous OpenAI-compatible route's wait: refused at once when no engine can serve (503
``engine_unavailable``), 504 ``timeout`` naming the job (which goes on), and a client that disconnects
cancels its job (``api/sync_wait.py``). No engine runs here: the dispatcher only records enqueues, so a
job stays queued for as long as a test needs."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.queue_only import WAV, rows, services


@pytest.fixture
def svc(tmp_path):
    s = services(tmp_path, sync_timeout_s=3)  # a wait that should not happen fails the test, never hangs it
    yield s
    s.close()


def transcribe(client, **data):
    with WAV.open("rb") as f:
        return client.post("/v1/audio/transcriptions", data={"model": "whisper-1", **data},
                           files={"file": ("call.wav", f)})


def test_in_process_engine_not_ready_answers_503_at_once_and_queues_nothing(svc):
    from api.app import create_app

    with TestClient(create_app(svc, engine_ready=lambda: False), raise_server_exceptions=False) as c:
        r = transcribe(c)
        later = c.post("/v1/jobs", files={"file": ("call.wav", WAV.read_bytes())})
    assert r.status_code == 503 and r.headers["retry-after"] == "7", r.text
    assert r.json()["error"]["code"] == "engine_unavailable"
    assert "in-process engine is not ready" in r.json()["error"]["message"]
    # only the synchronous route refuses: a queued job waits the outage out (docs/service.md)
    assert later.status_code == 202
    assert [j.id for j in rows(svc)] == svc.dispatcher.sent == [later.json()["id"]]


def test_every_engine_server_down_answers_503_one_up_is_served(tmp_path):
    """Production: the engine servers' /stats (the /readyz facts). All of them silent: 503 at once; one
    of two answering: the job is queued (the workers fail over), here ending in the deadline."""
    from api.app import create_app

    svc = services(tmp_path, embedded=False, engine_url="http://127.0.0.1:9", sync_timeout_s=0.5)
    try:
        app = create_app(svc)
        with TestClient(app, raise_server_exceptions=False) as c:
            down = transcribe(c)
            app.state.engine_stats = lambda: {"e1": None, "e2": {"running_requests": 0}}
            half = transcribe(c)
        assert down.status_code == 503 and down.headers["retry-after"] == "7"
        assert down.json()["error"] == {"code": "engine_unavailable", "message": "no engine server answers "
                                        "(http://127.0.0.1:9); nothing was queued, retry later"}
        assert half.status_code == 504 and half.json()["error"]["code"] == "timeout"
        assert len(svc.dispatcher.sent) == 1
    finally:
        svc.close()


def test_the_deadline_answers_504_naming_the_job_which_goes_on(tmp_path):
    from api.app import create_app

    svc = services(tmp_path, sync_timeout_s=0.5)
    try:
        with TestClient(create_app(svc), raise_server_exceptions=False) as c:
            r = transcribe(c)
            (job_id,) = svc.dispatcher.sent
            job = c.get(f"/v1/jobs/{job_id}")
            streamed = transcribe(c, stream="true")
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert f"GET /v1/jobs/{job_id}" in r.json()["error"]["message"]
        assert job.status_code == 200 and job.json()["status"] == "queued"  # not canceled: fetch it later
        events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert streamed.status_code == 200 and len(events) == 1 and '"code": "timeout"' in events[0]
        assert [j.status for j in rows(svc)] == ["queued", "queued"]
    finally:
        svc.close()


@pytest.fixture
def served(tmp_path):
    """``served(svc)``: the app over ``svc`` on uvicorn (the server the API runs on), on a loopback port."""
    import socket
    import threading
    import time

    import uvicorn

    from api.app import create_app

    servers = []

    def serve(svc) -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(svc), log_level="warning", timeout_graceful_shutdown=1))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((server, thread))
        while not server.started:
            assert thread.is_alive()
            time.sleep(0.02)
        return sock.getsockname()[1]

    yield serve
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def _post_then_leave(port: int, svc, stream: bool) -> None:
    """POST the recording over a raw socket and close it (a client that goes away) once the job is queued,
    or with ``stream`` once a first event has arrived and the stream waits for the next one."""
    import socket
    import time

    req = httpx.Request("POST", f"http://127.0.0.1:{port}/v1/audio/transcriptions",
                        data={"model": "whisper-1", **({"stream": "true"} if stream else {})},
                        files={"file": ("call.wav", WAV.read_bytes())})
    head = "".join(f"{k}: {v}\r\n" for k, v in req.headers.items())
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\n{head}\r\n".encode() + req.read())
        while not svc.dispatcher.sent:
            time.sleep(0.01)
        if stream:
            svc.bus.publish(svc.dispatcher.sent[0], {"type": "delta", "text": "Hello"})
            got = b""
            while b"transcript.text.delta" not in got:
                got += sock.recv(65536)
            time.sleep(0.2)  # the stream's thread is back waiting for the job's next event


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_cancels_its_job(tmp_path, served, stream):
    import time

    svc = services(tmp_path, sync_timeout_s=60)  # far off: only the client's leaving can end the wait
    value = svc.metrics.registry.get_sample_value
    # the request is counted once the route has returned: 499 for the answer nobody reads (a stream had
    # answered 200 already)
    request = {"method": "POST", "route": "/v1/audio/transcriptions", "status": "200" if stream else "499"}
    try:
        _post_then_leave(served(svc), svc, stream)
        (job_id,) = svc.dispatcher.sent
        deadline = time.monotonic() + 30  # guards against a hang only
        while value("diarist_http_requests_total", request) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        (job,) = rows(svc)
    finally:
        svc.close()
    assert (job.id, job.status, job.error_code) == (job_id, "canceled", "canceled")
    assert value("diarist_http_requests_total", request) == 1
    finished = {"class": "short", "status": "canceled"}
    assert value("diarist_jobs_finished_total", {**finished, "code": "canceled"}) == 1
    assert value("diarist_jobs_finished_total", {**finished, "code": "none"}) is None
