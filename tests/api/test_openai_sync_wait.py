"""The synchronous OpenAI-compatible route's wait: refused at once when no engine can serve (503
``engine_unavailable``), 504 ``timeout`` naming the job (which goes on), and a client that disconnects
cancels its job (``api/sync_wait.py``). No engine runs here: the dispatcher only records enqueues, so a
job stays queued for as long as a test needs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from diarist.models import Job

WAV = Path(__file__).resolve().parents[2] / "diarist" / "assets" / "demo_2spk_phonecall.wav"


class Dispatcher:
    """Records the jobs sent to the queue; no worker takes them."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def queue_for(self, duration_s):
        return "transcribe.short"

    def transcribe(self, job_id, queue):
        self.sent.append(job_id)

    def webhook(self, *a, **k):
        pass

    def ping(self):
        pass


def services(tmp_path, **overrides):
    from diarist.services import Services
    from diarist.settings import Settings

    st = Settings.model_validate({**Settings().model_dump(), "embedded": True, "data_dir": tmp_path, "auth": False,
                                  "retry_after_s": 7, **overrides})
    s = Services.from_settings(st, migrate=True)
    s.dispatcher = Dispatcher()
    return s


@pytest.fixture
def svc(tmp_path):
    s = services(tmp_path, sync_timeout_s=3)  # a wait that should not happen fails the test, never hangs it
    yield s
    s.close()


def rows(svc) -> list[Job]:
    with svc.db.session() as s:
        return list(s.query(Job))


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


def _asgi_post_then_leave(app, svc, stream: bool) -> list[dict]:
    """POST the recording to the route over raw ASGI, then disconnect (as a client that closes its socket)
    once the job is queued, or with ``stream`` once a first event was streamed and the stream waits for the
    next one; returns the messages the app sent."""
    data = {"stream": "true"} if stream else {}
    req = httpx.Request("POST", "http://test/v1/audio/transcriptions", data={"model": "whisper-1", **data},
                        files={"file": ("call.wav", WAV.read_bytes())})
    body = req.read()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/audio/transcriptions", "raw_path": b"",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("test", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in req.headers.items()]}
    sent: list[dict] = []
    calls = 0

    async def receive() -> dict:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        while not svc.dispatcher.sent:
            await asyncio.sleep(0.01)
        if stream:
            svc.bus.publish(svc.dispatcher.sent[0], {"type": "delta", "text": "Hello"})
            while not any(b"transcript.text.delta" in m.get("body", b"") for m in sent):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the stream's thread is back waiting for the job's next event
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    async def main() -> None:
        await asyncio.wait_for(app(scope, receive, send), timeout=30)

    asyncio.run(main())
    return sent


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_cancels_its_job(tmp_path, stream):
    from api.app import create_app

    svc = services(tmp_path, sync_timeout_s=3)  # bounds the wait should the client's leaving go unseen
    try:
        sent = _asgi_post_then_leave(create_app(svc), svc, stream)
        (job,) = rows(svc)
    finally:
        svc.close()
    assert job.id == svc.dispatcher.sent[0]
    assert (job.status, job.error_code) == ("canceled", "canceled")
    finished = {"class": "short", "status": "canceled"}
    assert svc.metrics.registry.get_sample_value("diarist_jobs_finished_total", {**finished, "code": "canceled"}) == 1
    assert svc.metrics.registry.get_sample_value("diarist_jobs_finished_total", {**finished, "code": "none"}) is None
    if not stream:  # the answer nobody reads: 499, which the request metrics count
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    # canceled when the client left, not once the deadline had ended the wait
    assert not any(b"timeout" in m.get("body", b"") for m in sent)


def test_two_files_in_one_request_are_refused_with_multiple_files(svc):
    """Both upload routes: 422 ``multiple_files`` (not Starlette's 400 ``bad_request``, nor one of the
    files transcribed silently), and no job."""
    from api.app import create_app

    audio = WAV.read_bytes()
    two = [("file", ("a.wav", audio)), ("file", ("b.wav", audio))]
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        jobs = c.post("/v1/jobs", files=two)
        extra = c.post("/v1/jobs", files=[("file", ("a.wav", audio)), ("notes", ("n.txt", b"x"))])
        oai = c.post("/v1/audio/transcriptions", data={"model": "whisper-1"}, files=two)
    for r in (jobs, extra, oai):
        assert r.status_code == 422 and r.json()["error"]["code"] == "multiple_files", r.text
        assert "one recording per request" in r.json()["error"]["message"]
    assert "'a.wav', 'b.wav'" in oai.json()["error"]["message"]
    assert rows(svc) == [] and svc.dispatcher.sent == []


def test_event_stream_times_are_rounded_to_the_millisecond(svc):
    """A segment event's float noise (12.340000000001) is served as 12.34 by GET /v1/jobs/{id}/events (and
    by the OpenAI stream, which reads the same events)."""
    import json

    from api.app import create_app
    from diarist import jobs

    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        job_id = c.post("/v1/jobs", files={"file": ("call.wav", WAV.read_bytes())}).json()["id"]
        with c.stream("GET", f"/v1/jobs/{job_id}/events") as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # the current status: subscribed
            svc.bus.publish(job_id, {"type": "segment", "start": 12.340000000001, "end": 13.9996, "text": "hi",
                                     "speaker": None})
            jobs.cancel(svc, job_id)  # the final status ends the stream
            data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert data[0] == {"start": 12.34, "end": 14.0, "text": "hi", "speaker": None}
    assert data[-1]["status"] == "canceled"
