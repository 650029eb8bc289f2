"""Idempotency, audio_url, cancellation, SSE events, webhooks: each through the real embedded stack."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.conftest import data_file
from tests.servers import QuietHandler, serve_http
from worker.webhooks import verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def yes_wav() -> bytes:
    return data_file("en_short_yes/yes_1000ms.wav").read_bytes()


def test_idempotency_key_returns_the_same_job(client, yes_wav, wait_job):
    h = {"Idempotency-Key": "client-retry-42"}
    first = client.post("/v1/jobs", files={"file": ("y.wav", yes_wav)}, headers=h)
    again = client.post("/v1/jobs", files={"file": ("y.wav", yes_wav)}, headers=h)
    assert first.status_code == 202 and again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    other = client.post("/v1/jobs", files={"file": ("y.wav", yes_wav)}, headers={"Idempotency-Key": "another"})
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    for j in (first.json(), other.json()):
        assert wait_job(client, j["id"])["status"] == "completed"


def test_idempotency_key_reused_for_a_different_request_is_422(client, yes_wav, wait_job):
    """The same key with other audio or other options is a client bug, not a retry: it must not be
    answered with the first job's transcript (IETF Idempotency-Key draft: 422)."""
    h = {"Idempotency-Key": "client-retry-43"}
    first = client.post("/v1/jobs", files={"file": ("y.wav", yes_wav)}, data={"num_speakers": "1"}, headers=h)
    assert first.status_code == 202
    jfk = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
    for files, data in [({"file": ("y.wav", jfk)}, {"num_speakers": "1"}),  # other audio, same name
                        ({"file": ("y.wav", yes_wav)}, {"num_speakers": "2"}),  # other options
                        ({"file": ("y.wav", yes_wav)}, {})]:
        r = client.post("/v1/jobs", files=files, data=data, headers=h)
        assert r.status_code == 422 and r.json()["error"]["code"] == "idempotency_key_reused", r.text
        assert first.json()["id"] in r.json()["error"]["message"]
    again = client.post("/v1/jobs", files={"file": ("other-name.wav", yes_wav)}, data={"num_speakers": "1"},
                        headers=h)  # the same request (a file name is not part of it)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert wait_job(client, first.json()["id"])["status"] == "completed"


def test_audio_url_is_fetched_with_its_headers(client, wait_job):
    wav = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
    seen = {}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            seen["auth"] = self.headers.get("authorization")
            self.reply(200, wav)

    with serve_http(Handler) as base:
        url = f"{base}/jfk.flac"
        r = client.post("/v1/jobs", json={"audio_url": url, "audio_headers": {"Authorization": "Bearer s3cret"},
                                          "num_speakers": 1})
        assert r.status_code == 202, r.text
        assert seen["auth"] == "Bearer s3cret"
        job = wait_job(client, r.json()["id"])
        assert job["status"] == "completed" and job["duration"] == pytest.approx(11.0, abs=0.01)
        assert job["options"]["num_speakers"] == 1
        text = client.get(f"/v1/jobs/{job['id']}/transcript", params={"format": "text"}).text.lower()
        assert "ask not what your country can do for you" in text
        missing = client.post("/v1/jobs", json={"audio_url": url.replace("/jfk.flac", "/missing")})
    # The fake server answers 200 to any path; an unreachable port is the real failure case.
    dead = client.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.wav"})
    assert dead.status_code == 422 and dead.json()["error"]["code"] == "url_fetch_failed"
    assert missing.status_code == 202


def test_sse_events_stream_status_and_text(client, wait_job):
    wav = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
    job = client.post("/v1/jobs", files={"file": ("jfk.flac", wav)}).json()
    events = []
    with client.stream("GET", f"/v1/jobs/{job['id']}/events") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
    kinds = [k for k, _ in events]
    assert kinds[0] == "status"
    assert events[-1] == ("status", {"status": "completed", "progress": 1.0, "error": None})
    # A job submitted just before the subscription may finish its decoding first; the text then is in the
    # transcript only. When the stream caught the decoding, the deltas spell the transcript.
    deltas = "".join(d["text"] for k, d in events if k == "delta")
    if deltas:
        assert "ask not" in deltas.lower()
    assert client.get(f"/v1/jobs/{job['id']}/events").text.count("event: status") == 1  # final: one event
    assert client.get("/v1/jobs/job_nope/events").status_code == 404


def test_webhook_is_signed_and_delivered_with_retries(client, stack, receiver, wait_job, yes_wav):
    hook = receiver(codes=[503])  # first attempt fails, the retry succeeds
    r = client.post("/v1/jobs", files={"file": ("y.wav", yes_wav)}, data={"webhook_url": hook.url})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert wait_job(client, job_id)["status"] == "completed"
    calls = hook.wait(2)
    assert len(calls) == 2
    (h1, _b1), (h2, b2) = calls
    assert h1["webhook-id"] == h2["webhook-id"]  # the same message, retried
    for headers, body in calls:
        assert verify(stack.settings.webhook_secret, headers, body)
        assert not verify(stack.settings.webhook_secret, headers, body + b" ")
    payload = json.loads(b2)
    assert payload["type"] == "job.completed" and payload["data"] == {"id": job_id, "status": "completed",
                                                                      "error": None}
    job = client.get(f"/v1/jobs/{job_id}").json()
    deadline = time.monotonic() + 30
    while job["webhook"]["status"] != "delivered" and time.monotonic() < deadline:
        time.sleep(0.05)  # the delivery row is written right after the receiver's answer is read
        job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["webhook"] == {"url": hook.url, "status": "delivered", "last_status_code": 200, "attempts": 2}


def test_webhook_on_cancel_and_4xx_is_not_retried(client, receiver):
    hook = receiver(codes=[410])
    wav = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
    job_id = client.post("/v1/jobs", files={"file": ("jfk.flac", wav)}, data={"webhook_url": hook.url}).json()["id"]
    deleted = client.delete(f"/v1/jobs/{job_id}").json()
    # Usually still queued or processing, so canceled; on a very fast machine it may have completed first.
    expected = "canceled" if deleted["status"] == "canceled" else "completed"
    if expected == "canceled":
        assert deleted["error"]["code"] == "canceled"
        # final, so not "not_ready": a client polling the transcript on not_ready would wait forever
        assert client.get(f"/v1/jobs/{job_id}/transcript").json()["error"]["code"] == "job_canceled"
    payload = json.loads(hook.wait(1)[0][1])
    assert payload["type"] == f"job.{expected}" and payload["data"]["id"] == job_id
    assert payload["data"]["status"] == expected
    # the body's error is the job row's (None when completed)
    assert payload["data"]["error"] == ({"code": "canceled"} if expected == "canceled" else None)
    assert len(hook.wait(2, timeout_s=1.5)) == 1  # 410 is final: no retry


def test_poison_audio_in_the_queue_fails_once_with_its_code(stack, client, wait_job):
    """A job whose stored audio cannot be decoded (bypassing the submit-time check) fails once, no loop."""
    import io

    from diarist.models import Job

    svc = stack.services
    job = Job(audio_key="jobs/poison/audio", duration_s=3.0, queue="transcribe.short")
    svc.store.put_file("jobs/poison/audio", io.BytesIO(b"definitely not audio " * 50))
    with svc.db.session() as s:
        s.add(job)
    svc.dispatcher.transcribe(job.id, "transcribe.short")
    done = wait_job(client, job.id)
    assert done["status"] == "failed" and done["error"]["code"] == "decode_failed"
    assert done["attempts"] == 1  # not retried: a decode failure is final (redeliveries: test_process.py)


def held_job(svc, name: str):
    """A ``processing`` job row that no worker runs, kept from the sweeper by a lease a (fictitious) live
    worker holds for an hour; its events are published by hand."""
    from diarist.models import Job

    job = Job(audio_key=f"jobs/{name}/audio", duration_s=10.0, status="processing", lease_owner="test",
              lease_expires_at=datetime.now(UTC) + timedelta(hours=1))
    with svc.db.session() as s:
        s.add(job)
    return job


def test_sse_relays_bus_events_until_the_final_status(stack, client):
    """Deterministic: a job held in `processing` (no worker owns it); events are published by hand."""
    import threading

    from diarist import jobs

    svc = stack.services
    job = held_job(svc, "held")
    got: list[tuple[str, dict]] = []
    opened = threading.Event()

    def read() -> None:
        with httpx.stream("GET", f"{stack.url}/v1/jobs/{job.id}/events", timeout=60) as r:
            name = None
            for line in r.iter_lines():
                opened.set()
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    got.append((name, json.loads(line[6:])))

    t = threading.Thread(target=read)
    t.start()
    assert opened.wait(30)
    svc.bus.publish(job.id, {"type": "delta", "text": "Hello, "})
    svc.bus.publish(job.id, {"type": "segment", "start": 0.0, "end": 1.5, "text": "Hello, world."})
    svc.bus.publish(job.id, {"type": "delta", "text": "world."})
    assert jobs.fail(svc, job.id, "engine_error", "test over")  # publishes the final status
    t.join(30)
    assert [k for k, _ in got] == ["status", "delta", "segment", "delta", "status"]
    assert got[1][1] == {"text": "Hello, "} and got[2][1]["end"] == 1.5
    assert got[-1][1]["status"] == "failed" and got[-1][1]["error"]["code"] == "engine_error"


def test_concurrent_requests_with_one_idempotency_key_make_one_job(stack, yes_wav, wait_job, client):
    from concurrent.futures import ThreadPoolExecutor

    def post(_i: int) -> httpx.Response:
        with httpx.Client(base_url=stack.url, timeout=120) as c:
            return c.post("/v1/jobs", files={"file": ("y.wav", yes_wav)}, headers={"Idempotency-Key": "race-1"})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(post, range(6)))
    assert {r.status_code for r in answers} <= {200, 202}
    assert sum(r.status_code == 202 for r in answers) == 1
    assert len({r.json()["id"] for r in answers}) == 1
    assert wait_job(client, answers[0].json()["id"])["status"] == "completed"


def test_many_open_event_streams_do_not_starve_other_routes(stack, client):
    """More SSE listeners than AnyIO's default 40 worker threads; sync routes must still answer."""
    from concurrent.futures import ThreadPoolExecutor

    from diarist import jobs

    svc = stack.services
    job = held_job(svc, "held2")
    n, opened = 48, threading.Semaphore(0)

    def listen(_i: int) -> int:
        with httpx.stream("GET", f"{stack.url}/v1/jobs/{job.id}/events", timeout=120) as r:
            lines = 0
            for line in r.iter_lines():
                if lines == 0:
                    opened.release()
                lines += bool(line)
            return lines

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(listen, i) for i in range(n)]
        try:
            assert all(opened.acquire(timeout=30) for _ in range(n))
            assert client.get("/v1/jobs", params={"limit": 1}, timeout=10).status_code == 200
            assert client.get("/healthz", timeout=10).status_code == 200
        finally:
            jobs.fail(svc, job.id, "engine_error", "test over")  # ends every stream, pass or fail
        assert all(f.result(timeout=60) >= 4 for f in futures)  # 2 events x (event + data) lines


def test_an_unknown_option_is_refused_by_name_not_ignored(client):
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    before = [j["id"] for j in client.get("/v1/jobs", params={"limit": 100}).json()["data"]]
    r = client.post("/v1/jobs", files={"file": ("yes.wav", wav)}, data={"num_speaker": "2"})  # typo of num_speakers
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert "num_speaker" in r.json()["error"]["message"]
    r = client.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.wav", "response_format": "srt"})
    assert r.status_code == 422 and "response_format" in r.json()["error"]["message"], r.text
    after = [j["id"] for j in client.get("/v1/jobs", params={"limit": 100}).json()["data"]]
    assert after == before  # nothing was created
