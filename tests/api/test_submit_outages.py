"""Submit during an outage (issue 17 item 5): 503 with the dependency's code and Retry-After, and nothing
left behind (no row, no object), so a retry with the same Idempotency-Key starts afresh."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from diarist.models import Job

WAV = Path(__file__).resolve().parents[2] / "diarist" / "assets" / "demo_2spk_phonecall.wav"


class Dispatcher:
    """Records enqueues; raises like kombu does when Redis refuses connections while ``down``."""

    def __init__(self) -> None:
        self.down, self.sent = False, []

    def queue_for(self, duration_s):
        return "transcribe.short"

    def transcribe(self, job_id, queue):
        if self.down:
            from kombu.exceptions import OperationalError

            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        self.sent.append(job_id)

    def webhook(self, *a, **k):
        pass

    def ping(self):
        pass


@pytest.fixture
def svc(tmp_path):
    from diarist.services import Services
    from diarist.settings import Settings

    st = Settings.model_validate({**Settings().model_dump(), "embedded": True, "data_dir": tmp_path, "auth": False,
                                  "retry_after_s": 7})
    s = Services.from_settings(st, migrate=True)
    s.dispatcher = Dispatcher()
    yield s
    s.close()


def post(client, key="k1"):
    with WAV.open("rb") as f:
        return client.post("/v1/jobs", files={"file": ("a.wav", f)}, headers={"Idempotency-Key": key})


def rows(svc) -> list[Job]:
    with svc.db.session() as s:
        return list(s.query(Job))


def objects(svc) -> list[Path]:
    return [p for p in Path(svc.settings.objects_dir).rglob("*") if p.is_file()]


def test_queue_down_answers_503_leaves_nothing_and_the_same_key_then_runs(svc):
    from api.app import create_app

    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        svc.dispatcher.down = True
        r = post(c)
        assert r.status_code == 503 and r.headers["retry-after"] == "7"
        assert r.json()["error"]["code"] == "queue_unavailable"
        assert rows(svc) == [] and objects(svc) == []
        svc.dispatcher.down = False
        r = post(c)  # the client's retry with the same key: a new job, not a replayed failure
        assert r.status_code == 202 and r.json()["status"] == "queued"
        assert [j.id for j in rows(svc)] == svc.dispatcher.sent == [r.json()["id"]]


def test_storage_down_answers_503_storage_unavailable(svc, monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    from api.app import create_app

    def down(key, f):
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")

    monkeypatch.setattr(svc.store, "put_file", down)
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        r = post(c)
    assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable"
    assert r.headers["retry-after"] == "7"
    assert rows(svc) == [] and svc.dispatcher.sent == []


def test_database_down_answers_503_database_unavailable_and_deletes_the_upload(svc):
    from api.app import create_app
    from diarist.db import Database

    app = create_app(svc)
    real = svc.db
    svc.db = Database("postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2")
    try:
        with TestClient(app, raise_server_exceptions=False) as c, WAV.open("rb") as f:
            r = post(c)  # fails at the Idempotency-Key lookup, before anything is stored
            no_key = c.post("/v1/jobs", files={"file": ("a.wav", f)})  # fails at the insert: upload deleted
    finally:
        svc.db.dispose()
        svc.db = real
    for resp in (r, no_key):
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "database_unavailable", resp.text
    assert rows(svc) == [] and objects(svc) == [] and svc.dispatcher.sent == []


def test_a_job_failed_by_an_outage_is_resumed_by_a_retry_with_its_key(svc):
    """An older version left failed ``queue_unavailable`` rows (and the outage bound fails jobs with
    ``*_unavailable``): the client's retry with the same Idempotency-Key queues that job again instead of
    replaying the failure; a job that failed for its own reasons is replayed as it is."""
    from sqlalchemy import update

    from api.app import create_app

    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        first = post(c, key="k-outage").json()["id"]
        other = post(c, key="k-bad").json()["id"]
        with svc.db.session() as s:
            s.execute(update(Job).where(Job.id == first).values(status="failed", error_code="queue_unavailable",
                                                                error_message="x", attempts=0))
            s.execute(update(Job).where(Job.id == other).values(status="failed", error_code="decode_failed",
                                                                error_message="x"))
        svc.dispatcher.sent.clear()
        resumed = post(c, key="k-outage")
        replayed = post(c, key="k-bad")
    assert resumed.status_code == 200 and resumed.headers["idempotent-replayed"] == "true"
    assert (resumed.json()["id"], resumed.json()["status"], resumed.json()["error"]) == (first, "queued", None)
    assert svc.dispatcher.sent == [first]
    assert (replayed.json()["status"], replayed.json()["error"]["code"]) == ("failed", "decode_failed")


def test_an_unwritable_object_directory_answers_503_storage_unavailable(svc):
    """The local store's directory cannot be written: 503 storage_unavailable with Retry-After (not a 500
    ``PermissionError``), no row, nothing enqueued, and /readyz reports the object store down."""
    import shutil

    from api.app import create_app

    root = Path(svc.settings.objects_dir)
    shutil.rmtree(root, ignore_errors=True)
    root.write_bytes(b"")  # a file where the directory must be: root is not stopped by permissions
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        r = post(c)
        ready = c.get("/readyz")
    assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable", r.text
    assert r.headers["retry-after"] == "7"
    assert rows(svc) == [] and svc.dispatcher.sent == []
    assert ready.status_code == 503 and ready.json()["checks"]["object_store"] == "error"
    assert str(root) not in ready.text


def test_database_down_with_api_keys_on_answers_503_on_every_route(svc):
    """With keys on, the key lookup is the first thing to meet the database: a Postgres outage there (or in
    any route that has no handling of its own) answers 503 ``database_unavailable`` with Retry-After, not a
    500 ``internal_error``; a real bug stays a 500."""
    from api.app import create_app
    from diarist.db import Database

    svc.settings = svc.settings.model_copy(update={"auth": True})
    app = create_app(svc)

    @app.get("/test-bug")
    def bug():
        raise RuntimeError("a bug")

    real = svc.db
    svc.db = Database("postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2")
    auth = {"Authorization": "Bearer dia_00000000_x"}
    try:
        with TestClient(app, raise_server_exceptions=False) as c, WAV.open("rb") as f:
            answers = [c.post("/v1/jobs", files={"file": ("a.wav", f)}, headers=auth),
                       c.get("/v1/jobs/job_0", headers=auth), c.get("/v1/jobs", headers=auth)]
            bug_answer = c.get("/test-bug")
    finally:
        svc.db.dispose()
        svc.db = real
    for r in answers:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable" and r.headers["retry-after"] == "7"
    assert bug_answer.status_code == 500 and bug_answer.json()["error"]["code"] == "internal_error"
    assert rows(svc) == [] and objects(svc) == [] and svc.dispatcher.sent == []


def test_a_missing_bucket_answers_503_storage_unavailable(svc, monkeypatch):
    """The bucket was deleted (or a trial S3 server restarted empty): 503 storage_unavailable with
    Retry-After, not 500 ``NoSuchBucket``; nothing stored."""
    from botocore.exceptions import ClientError

    from api.app import create_app

    def no_bucket(key, f):
        raise ClientError({"Error": {"Code": "NoSuchBucket", "Message": "The specified bucket does not exist"},
                           "ResponseMetadata": {"HTTPStatusCode": 404}}, "PutObject")

    monkeypatch.setattr(svc.store, "put_file", no_bucket)
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        r = post(c)
    assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable", r.text
    assert rows(svc) == [] and svc.dispatcher.sent == []
