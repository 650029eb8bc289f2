"""The production topology with real processes: Postgres + Redis + S3 (moto) + ``diarist engine`` +
``diarist worker --class short|webhooks`` + ``diarist serve``, on loopback.

Crash safety: a worker SIGKILLed mid-job → the job completes exactly once after a restart; the engine
server killed mid-job → the job is retried and completes. Slow (model loads in a separate process); the
servers come from Debian packages (skipped loudly when missing, failed under DIARIST_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import data_file
from tests.servers import Receiver, free_port, start_postgres, start_redis, start_s3, wait_port
from worker.webhooks import verify

pytestmark = [pytest.mark.services, pytest.mark.slow]
FINAL = ("completed", "failed", "canceled")
LEASE_S = 120
"""Longer than any stall a loaded machine puts between two renewals of a live worker (lease_s / 4 apart):
with a lease of a few seconds, a renewal held up under load let a sweeper hand a live job to a second
attempt (three attempts, or a message redelivered after the visibility timeout claimed it). A dead worker's
lease is expired by the test itself (:func:`expire_lease`) rather than waited out."""


class Proc:
    """A ``diarist`` subcommand in its own process, its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict, logdir: Path) -> None:
        self.name, self.args, self.env, self.log = name, args, env, logdir / f"{name}.log"
        self.p: subprocess.Popen | None = None

    def start(self) -> Proc:
        out = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.p = subprocess.Popen([sys.executable, "-m", "cli", *self.args], env=self.env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.p is not None and self.p.poll() is None:
            os.killpg(self.p.pid, sig)
            self.p.wait(timeout=30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@pytest.fixture(scope="module")
def prod(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    stops = []
    procs: dict[str, Proc] = {}
    try:
        db, stop = start_postgres()
        stops.append(stop)
        broker, stop = start_redis()
        stops.append(stop)
        s3, stop = start_s3()
        stops.append(stop)
        eport, aport = free_port(), free_port()
        scratch = tmp_path_factory.mktemp("scratch")  # the processes' scratch directories (diarist.scratch)
        env = {**os.environ, "DIARIST_DATABASE_URL": db, "DIARIST_BROKER_URL": broker, "DIARIST_STORAGE": "s3",
               "DIARIST_S3_ENDPOINT_URL": s3, "DIARIST_S3_BUCKET": "prod", "DIARIST_S3_CREATE_BUCKET": "true",
               "DIARIST_S3_ACCESS_KEY_ID": "t", "DIARIST_S3_SECRET_ACCESS_KEY": "t", "DIARIST_AUTH": "true",
               "DIARIST_ENGINE_URL": f"http://127.0.0.1:{eport}", "DIARIST_ENGINE_PORT": str(eport),
               "DIARIST_WEBHOOK_ALLOW_HOSTS": '["127.0.0.1"]', "DIARIST_VISIBILITY_TIMEOUT_S": "6",
               "DIARIST_LEASE_S": str(LEASE_S), "DIARIST_SWEEP_INTERVAL_S": "1",
               "DIARIST_ENGINE_ATTEMPTS": "30", "DIARIST_ENGINE_RETRY_DELAY_S": "1",
               "DIARIST_ENGINE_KV_BUDGET_BYTES": str(256 << 20), "DIARIST_ENGINE_MAX_RUNNING_REQUESTS": "16",
               "OMP_NUM_THREADS": "1", "DIARIST_SCRATCH_DIR": str(scratch)}
        env.pop("DIARIST_EMBEDDED", None)
        subprocess.run([sys.executable, "-m", "cli", "migrate"], env=env, check=True, capture_output=True)
        key = json.loads(subprocess.run([sys.executable, "-m", "cli", "keys", "create", "--name", "t",
                                         "--json"], env=env, check=True, capture_output=True, text=True).stdout)
        procs["engine"] = Proc("engine", ["engine"], env, logs).start()
        procs["short"] = Proc("short", ["worker", "--class", "short", "--concurrency", "2"], env, logs).start()
        procs["webhooks"] = Proc("webhooks", ["worker", "--class", "webhooks"], env, logs).start()
        procs["api"] = Proc("api", ["serve", "--port", str(aport)], env, logs).start()
        wait_port(aport, 120)
        wait_port(eport, 300)
        # The engine listens before it loads its model (cli/commands/engine.py): ready once /health answers.
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{eport}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, procs["engine"].tail()
            time.sleep(0.2)
        client = httpx.Client(base_url=f"http://127.0.0.1:{aport}", timeout=60,
                              headers={"Authorization": f"Bearer {key['token']}"})
        yield {"client": client, "key": key, "procs": procs, "eport": eport, "broker": broker, "db": db,
               "scratch": scratch}
        client.close()
    finally:
        for p in procs.values():
            p.kill(signal.SIGTERM)
        for stop in reversed(stops):
            stop()


def wait_status(client, job_id, states, timeout_s=300.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def submit(prod, rel: str, **data) -> str:
    with data_file(rel).open("rb") as f:
        r = prod["client"].post("/v1/jobs", files={"file": (Path(rel).name, f)}, data=data)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_ready_and_a_job_completes(prod, receiver_server):
    c = prod["client"]
    ready = c.get("/readyz").json()
    assert ready["status"] == "ok", ready
    job_id = submit(prod, "en_jfk_inaugural/jfk.flac", webhook_url=receiver_server.url)
    job = wait_status(c, job_id, FINAL)
    assert job["status"] == "completed", (job, prod["procs"]["short"].tail(), prod["procs"]["engine"].tail())
    assert job["metrics"]["engine_id"].endswith(f":{prod['eport']}:cpu") and job["metrics"]["rtf"] > 0
    assert "ask not" in c.get(f"/v1/jobs/{job_id}/transcript", params={"format": "text"}).text.lower()
    headers, body = receiver_server.wait(1)[0]
    assert json.loads(body)["data"]["id"] == job_id
    assert verify(prod["key"]["webhook_secret"], headers, body)  # signed with this key's own secret


def test_known_speaker_across_the_processes(prod):
    """Split deployment: the API process (no model) embeds an enrollment clip through the engine server's
    POST /internal/embed, and the separate worker names the job's speaker from the database."""
    c = prod["client"]
    with data_file("en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav").open("rb") as f:
        r = c.post("/v1/speakers", data={"name": "Reader"}, files={"file": ("reader.wav", f)})
    assert r.status_code == 201, (r.text, prod["procs"]["engine"].tail())
    job = wait_status(c, submit(prod, "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav",
                                speaker_profiles="all"), FINAL)
    assert job["status"] == "completed", job
    t = c.get(f"/v1/jobs/{job['id']}/transcript").json()
    assert t["identities"]["S01"]["name"] == "Reader" and t["identities"]["S01"]["profile_id"] == r.json()["id"]
    assert c.delete(f"/v1/speakers/{r.json()['id']}").status_code == 200


def expire_lease(db, job_id: str, pid: int) -> None:
    """Move the lease of ``job_id``'s running attempt, which must belong to the (dead) process ``pid``, into
    the past: what ``lease_s`` of wall time does to a dead worker's lease, without waiting for it."""
    from sqlalchemy import select, update

    from diarist.models import Job, utcnow

    with db.session() as s:
        status, owner = s.execute(select(Job.status, Job.lease_owner).where(Job.id == job_id)).one()
        assert status == "processing" and owner.split(":")[1] == str(pid), (status, owner, pid)
        res = s.execute(update(Job).where(Job.id == job_id, Job.lease_owner == owner)
                        .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        assert res.rowcount == 1


def settled_webhooks(db, job_id: str, timeout_s: float = 120.0) -> list[tuple[str, str]]:
    """``(event, state)`` of the job's outbox messages once none can be sent again (delivered or failed)."""
    from sqlalchemy import select

    from diarist.models import WebhookOutbox

    deadline = time.monotonic() + timeout_s
    while True:
        with db.session() as s:
            rows = [tuple(r) for r in s.execute(select(WebhookOutbox.event, WebhookOutbox.state)
                                                .where(WebhookOutbox.job_id == job_id))]
        if (rows and all(state in ("delivered", "failed") for _e, state in rows)) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_worker_killed_mid_job_completes_exactly_once(prod, receiver_server):
    from diarist.db import Database

    c, procs, db = prod["client"], prod["procs"], Database(prod["db"])
    n_before = len(receiver_server.calls)
    job_id = submit(prod, "en_2spk_phonecall_pyannote_sample/sample.wav", webhook_url=receiver_server.url)
    assert wait_status(c, job_id, ("processing", *FINAL))["status"] == "processing"
    pid = procs["short"].p.pid
    procs["short"].kill()  # SIGKILL: no ack, no cleanup
    left = prod["scratch"] / f"worker-short-{pid}"
    assert left.is_dir()  # its scratch directory stays behind ...
    try:
        expire_lease(db, job_id, pid)  # still processing, under the dead process's lease
        procs["short"].start()
        job = wait_status(c, job_id, FINAL)
        assert job["status"] == "completed", (job, procs["short"].tail())
        assert not left.exists()  # ... until the next worker starts
        assert (prod["scratch"] / f"worker-short-{procs['short'].p.pid}").is_dir()
        assert job["attempts"] == 2  # re-driven once (the sweeper, or the message redelivered), and counted
        # Final: no attempt can complete it again; once its outbox settles no message can be sent again.
        assert settled_webhooks(db, job_id) == [("job.completed", "delivered")]
    finally:
        db.dispose()
    mine = [json.loads(b) for _h, b in receiver_server.calls[n_before:] if json.loads(b)["data"]["id"] == job_id]
    assert len(mine) == 1 and mine[0]["type"] == "job.completed", receiver_server.calls[n_before:]


def test_engine_killed_mid_job_is_retried(prod):
    c, procs = prod["client"], prod["procs"]
    job_id = submit(prod, "en_2spk_phonecall_pyannote_sample/sample.wav")
    assert wait_status(c, job_id, ("processing", *FINAL))["status"] == "processing"
    time.sleep(0.5)
    procs["engine"].kill()
    procs["engine"].start()
    job = wait_status(c, job_id, FINAL, timeout_s=600)
    assert job["status"] == "completed", (job, procs["engine"].tail(), procs["short"].tail())
    assert job["attempts"] >= 2


def test_api_killed_loses_nothing(prod):
    c, procs = prod["client"], prod["procs"]
    job_id = submit(prod, "en_jfk_inaugural/jfk.flac")
    procs["api"].kill()  # SIGKILL: the job lives in Postgres, Redis and S3, not in the API
    procs["api"].start()
    wait_port(int(str(c.base_url).rsplit(":", 1)[1].strip("/")), 120)
    job = wait_status(c, job_id, FINAL)
    assert job["status"] == "completed" and job["attempts"] == 1


@pytest.fixture(scope="module")
def receiver_server():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def ninety_seconds(tmp_path_factory) -> Path:
    """Three distinct 30 s meeting clips end to end (16 kHz WAV): a short-class job whose windows decode
    together for several seconds on CPU."""
    import numpy as np

    from tests.conftest import pcm16_wav
    from transcription.audio import decode_audio

    clips = ("en_ami_meeting_dev00_2spk/dev00.wav", "en_ami_meeting_trn07_4spk/trn07.wav",
             "en_ami_meeting_trn05_4spk/trn05.wav")
    samples = np.concatenate([decode_audio(data_file(rel)).mono for rel in clips])
    path = tmp_path_factory.mktemp("cancel") / "meeting.wav"
    path.write_bytes(pcm16_wav(samples))
    return path


ENGINE_DROP_S = 10.0
"""Bound on a hang from the DELETE to an idle engine (the worker's row poll, DIARIST_CANCEL_POLL_S 0.5 s,
plus one engine step, which on a loaded 2-core machine can take seconds). That the cancel reached the engine
is shown by the windows it aborted (finished fewer than submitted), not by this bound."""


def test_cancel_through_the_api_stops_the_engine_sequences(prod, ninety_seconds):
    c, stats_url = prod["client"], f"http://127.0.0.1:{prod['eport']}/stats"

    def stats() -> dict:
        return httpx.get(stats_url, timeout=10).json()

    decode0 = stats()["decode_tokens"]
    with ninety_seconds.open("rb") as f:
        r = c.post("/v1/jobs", files={"file": ("meeting.wav", f)})
    assert r.status_code == 202 and r.json()["queue"] == "transcribe.short", r.text
    job_id = r.json()["id"]
    deadline = time.monotonic() + 300
    while not ((s := stats())["running_requests"] > 0 and s["decode_tokens"] > decode0):
        assert time.monotonic() < deadline, (s, prod["procs"]["short"].tail())
        time.sleep(0.05)
    running, finished0 = s["running_requests"], s["finished"]
    r = c.delete(f"/v1/jobs/{job_id}")
    t_cancel = time.monotonic()
    assert r.status_code == 200 and r.json()["status"] == "canceled", r.text
    while (s := stats())["running_requests"] or s["waiting_requests"] or s["kv_tokens_used"]:
        assert time.monotonic() - t_cancel < 60, s
        time.sleep(0.05)
    dropped_after = time.monotonic() - t_cancel
    assert dropped_after < ENGINE_DROP_S, (dropped_after, running, prod["procs"]["short"].tail())
    assert s["decode_tokens"] > decode0 and running >= 1
    assert s["finished"] - finished0 < running  # the windows running at the cancel were aborted, not run out
    job = c.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["error"]["code"]) == ("canceled", "canceled")


def test_api_metrics_report_queue_depth_and_liveness(prod):
    """The API's /metrics against Redis and the real processes: the broker answers, the short and webhooks
    workers answer a ping, the engine server is up, and the queue depth is a number per queue."""
    from prometheus_client.parser import text_string_to_metric_families

    def value(fams, name, **labels):
        return next(s.value for s in fams[name].samples if all(s.labels.get(k) == v for k, v in labels.items()))

    from celery import Celery

    from diarist.settings import Settings
    from worker.celery_app import CeleryDispatcher, configure

    st = Settings(broker_url=prod["broker"])
    sender = CeleryDispatcher(st, configure(st, Celery("probe")))
    for _ in range(3):  # no long worker runs here: these wait in transcribe.long (for no job: a no-op if run)
        sender.transcribe("job_depth_probe", "transcribe.long")
    assert sender.queue_depths()["transcribe.long"] == 3
    deadline = time.monotonic() + 60
    while True:
        fams = {f.name: f for f in text_string_to_metric_families(prod["client"].get("/metrics").text)}
        if value(fams, "diarist_workers", **{"class": "short"}) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(1)  # a freshly restarted worker may not answer pings yet (the answers are cached 5 s)
    assert value(fams, "diarist_broker_up") == 1
    assert value(fams, "diarist_workers", **{"class": "short"}) == 1
    assert value(fams, "diarist_workers", **{"class": "webhooks"}) == 1
    assert value(fams, "diarist_workers", **{"class": "long"}) == 0
    assert {s.labels["queue"] for s in fams["diarist_queue_messages"].samples} == {
        "transcribe.short", "transcribe.long", "webhooks"}
    assert value(fams, "diarist_queue_messages", queue="transcribe.long") == 3
    assert [s.value for s in fams["diarist_engine_up"].samples] == [1.0]
