"""``diarist worker`` as a real process under SIGTERM (issue 33 items 15 and 25): with a job running against
an engine that never finishes, SIGTERM ends the process at once, the job is back to ``queued`` with its
attempt not spent and a new message waits for it, the engine saw its request closed (the abort), and every
line the process wrote, in JSON log format, is a JSON object (no Celery banner or shutdown print).

SQLite and kombu's filesystem broker: no server but the stand-in engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from celery import Celery

from diarist.models import Job
from tests.conftest import REPO, wav_bytes
from tests.servers import QuietHandler, serve_http
from tests.stand_in_engine import INFO

STOP_HANG_S = 30.0
"""Bound on a hang from SIGTERM to exit; not a speed figure (waiting for the job would be forever here)."""


class HangingEngine(QuietHandler):
    """Answers GET /health and GET /info (a Whisper engine, as the stand-in engine does); a POST gets one
    ``queued`` line, then keep-alive blank lines until the client closes the connection (``closed`` set)."""

    started = threading.Event()
    closed = threading.Event()

    def do_GET(self) -> None:
        body = INFO if self.path == "/info" else {"status": "ok"}
        self.reply(200, json.dumps(body).encode(), "application/json")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.end_headers()
        try:
            self.wfile.write(b'{"type": "queued", "duration": 0.1}\n')
            self.wfile.flush()
            type(self).started.set()
            for _ in range(600):
                time.sleep(0.1)
                self.wfile.write(b"\n")
                self.wfile.flush()
        except OSError:
            type(self).closed.set()


@pytest.mark.slow
def test_sigterm_hands_the_running_job_back_and_logs_only_json(tmp_path):
    from diarist.services import Services
    from diarist.settings import Settings
    from worker.celery_app import CeleryDispatcher, configure

    with serve_http(HangingEngine) as engine_url:
        env = {**os.environ, "PYTHONPATH": str(REPO), "DIARIST_DATA_DIR": str(tmp_path / "data"),
               "DIARIST_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "DIARIST_EMBEDDED": "false",
               "DIARIST_BROKER_URL": "filesystem://localhost/", "DIARIST_LOG_FORMAT": "json",
               "DIARIST_ENGINE_URL": engine_url, "DIARIST_CANCEL_POLL_S": "0.2"}
        st = Settings(_env_file=None, data_dir=tmp_path / "data", database_url=env["DIARIST_DATABASE_URL"],
                      embedded=False, broker_url=env["DIARIST_BROKER_URL"])
        svc = Services.from_settings(st, migrate=True)
        sender = CeleryDispatcher(st, configure(st, Celery("sender")))
        svc.store.put_bytes("jobs/t/audio", wav_bytes(1.0))
        job = Job(audio_key="jobs/t/audio", duration_s=1.0, queue="transcribe.short")
        with svc.db.session() as s:
            s.add(job)
        job_id = job.id
        sender.transcribe(job_id, "transcribe.short")
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--class", "short", "--concurrency", "2"],
                                    env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            assert HangingEngine.started.wait(120), log.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=STOP_HANG_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = log.read_text()
        assert rc == 0, text[-3000:]
        assert HangingEngine.closed.wait(5), "the engine request was not closed"
        with svc.db.session() as s:
            row = s.get(Job, job_id)
            assert (row.status, row.attempts, row.lease_owner) == ("queued", 0, None), text[-3000:]
        assert sender.queue_depths()["transcribe.short"] == 1  # the re-sent message, for another worker
        svc.close()
    lines = [x for x in text.splitlines() if x.strip()]
    bad = [x for x in lines if not x.lstrip().startswith("{")]
    assert not bad, bad
    out = [json.loads(x) for x in lines]
    assert any("handing 1 running job(s) back" in o["message"] for o in out)
    assert any(o["message"] == f"job {job_id} handed back for re-drive: this worker is stopping" for o in out)
    assert not any("exc" in o for o in out)
