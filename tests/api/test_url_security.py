"""Outbound URLs through the API: separate allow-lists for webhook targets and audio_url downloads, and an
audio_url's credentials and query string (pre-signed links) never stored, shown or logged."""

from __future__ import annotations

import http.server
import logging
import threading
import time

import pytest

from diarist.models import Job, WebhookDelivery
from tests.conftest import data_file
from tests.servers import QuietHandler

SECRET = "S3cretSig"
PROMPT = "Quuxwidget Corp"


def test_webhook_and_audio_url_allow_lists_are_separate(app_with):
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    only_hooks = app_with(webhook_allow_hosts=["127.0.0.1"], audio_url_allow_hosts=[])
    r = only_hooks.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.wav"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "url_not_allowed"
    assert "DIARIST_AUDIO_URL_ALLOW_HOSTS" in r.json()["error"]["message"]
    r = only_hooks.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"webhook_url": "http://127.0.0.1:9/h"})
    assert r.status_code == 202, r.text

    only_audio = app_with(webhook_allow_hosts=[], audio_url_allow_hosts=["127.0.0.1"])
    r = only_audio.post("/v1/jobs", files={"file": ("y.wav", wav)}, data={"webhook_url": "http://127.0.0.1:9/h"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "url_not_allowed"
    assert "DIARIST_WEBHOOK_ALLOW_HOSTS" in r.json()["error"]["message"]
    r = only_audio.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.wav"})  # allowed, then unreachable
    assert r.status_code == 422 and r.json()["error"]["code"] == "url_fetch_failed"


def test_cgnat_audio_url_is_refused(app_with):
    r = app_with(audio_url_allow_hosts=[]).post("/v1/jobs", json={"audio_url": "http://100.64.0.7/a.wav"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "url_not_allowed"


@pytest.fixture
def audio_server():
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    seen: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.reply(200, wav)

        def do_POST(self) -> None:  # the webhook receiver
            self.rfile.read(int(self.headers.get("content-length", 0)))
            seen.append(self.path)
            self.reply(204)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def log_lines(monkeypatch):
    """Everything the service's log handler (diarist.logs, JSON) writes while the test runs, at DEBUG (httpx
    included, whose request lines name every URL it fetches or posts to)."""
    import io

    from diarist.logs import make_handler

    monkeypatch.setattr(logging.getLogger("httpx"), "level", logging.NOTSET)
    buf, root = io.StringIO(), logging.getLogger()
    handler, level = make_handler("json", buf), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield buf
    root.removeHandler(handler)
    root.setLevel(level)


def test_audio_url_credentials_and_query_are_not_stored_shown_or_logged(stack, client, wait_job, audio_server,
                                                                        log_lines):
    hostport, seen = audio_server
    url = f"http://alice:{SECRET}pw@{hostport}/calls/yes.wav?X-Amz-Signature={SECRET}&X-Amz-Credential=AKIA#{SECRET}"
    hook = f"http://{hostport}/hook?token={SECRET}"
    r = client.post("/v1/jobs", json={"audio_url": url, "webhook_url": hook, "prompt": PROMPT})
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["id"])
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:  # the webhook POST reaches the same server
        time.sleep(0.05)
    assert job["status"] == "completed", job
    assert seen[0] == f"/calls/yes.wav?X-Amz-Signature={SECRET}&X-Amz-Credential=AKIA"  # the fetch used it all
    assert job["filename"] == f"http://{hostport}/calls/yes.wav"
    assert job["webhook"]["url"] == f"http://{hostport}/hook"
    shown = [r.text, client.get(f"/v1/jobs/{job['id']}").text, client.get("/v1/jobs").text,
             client.get(f"/admin/jobs/{job['id']}").text, client.get("/admin/jobs").text]
    assert all(SECRET not in page for page in shown)
    with stack.services.db.session() as s:
        row = s.get(Job, job["id"])
        stored = [str(getattr(row, c.key)) for c in Job.__table__.columns if c.key != "webhook_url"]
        deliveries = [d.url for d in s.query(WebhookDelivery).filter(WebhookDelivery.job_id == job["id"])]
    assert all(SECRET not in v for v in stored)
    assert all(SECRET not in u for u in deliveries)
    logged = log_lines.getvalue()
    assert f"http://{hostport}/hook" in logged  # httpx logged the delivery, without its query
    assert SECRET not in logged and PROMPT not in logged
