"""Prometheus /metrics: values computed from known job rows (SQLite and Postgres), engine metrics from a real
engine (embedded API and engine server), and names that follow the Prometheus conventions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import JobsCollector
from diarist.db import Database, upgrade
from diarist.http.engine_metrics import EngineCollector
from diarist.models import Job, JobMetrics

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, family: str, name: str, **labels: str) -> float:
    """The value of one sample, matched by its full name and labels (fails when missing)."""
    for s in fams[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {name}{labels}")


def fill(db: Database) -> None:
    """Two completed and one failed short job, one completed long job, one queued short job; webhook states
    delivered, failed, failed."""
    def job(jid, status, queue="transcribe.short", hook=None):
        created = NOW - timedelta(minutes=30)
        return Job(id=jid, status=status, queue=queue, duration_s=10.0, created_at=created, updated_at=created,
                   webhook_status=hook)

    with db.session() as s:
        s.add_all([job("job_a", "completed", hook="delivered"), job("job_b", "completed", hook="failed"),
                   job("job_c", "failed", hook="failed"), job("job_d", "completed", queue="transcribe.long"),
                   job("job_e", "queued")])


def scrape(db: Database) -> dict:
    reg = CollectorRegistry()
    reg.register(JobsCollector(db, worker_alive_s=45.0))
    return families(generate_latest(reg).decode())


def check_job_gauges(fams: dict) -> None:
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="completed", **{"class": "short"}) == 2
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="failed", **{"class": "short"}) == 1
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="queued", **{"class": "short"}) == 1
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="completed", **{"class": "long"}) == 1
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="canceled", **{"class": "long"}) == 0
    assert sample(fams, "diarist_webhook_jobs", "diarist_webhook_jobs", status="failed") == 2
    assert sample(fams, "diarist_webhook_jobs", "diarist_webhook_jobs", status="delivered") == 1
    assert sample(fams, "diarist_webhook_jobs", "diarist_webhook_jobs", status="retrying") == 0


def test_job_gauges_from_rows_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    upgrade(url)
    db = Database(url)
    fill(db)
    check_job_gauges(scrape(db))
    db.dispose()


@pytest.mark.services
def test_workers_are_counted_from_their_heartbeats(tmp_path):
    """Issue 33 item 14: ``diarist_workers`` counts the processes whose heartbeat is within the bound (a
    worker busy with jobs beats even when a Celery ping would time out: the ping once read 0 under load),
    and a process past it is gone."""
    from diarist.models import WorkerBeat

    url = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    upgrade(url)
    db = Database(url)
    now = datetime.now(UTC)
    try:
        with db.session() as s:
            for name, queues, ago in (("short@a:11", "transcribe.short", 5), ("short@b:12", "transcribe.short", 30),
                                      ("long@a:13", "transcribe.long", 46), ("webhooks@a:14", "webhooks", 1),
                                      ("embedded:15", "transcribe.short,transcribe.long,webhooks", 2)):
                s.add(WorkerBeat(name=name, queues=queues, running=3, started_at=now - timedelta(hours=1),
                                 seen_at=now - timedelta(seconds=ago)))
        fams = scrape(db)
    finally:
        db.dispose()
    got = {s.labels["class"]: s.value for s in fams["diarist_workers"].samples}
    assert got == {"short": 2, "long": 0, "webhooks": 1, "embedded": 1}


def test_job_gauges_from_rows_on_postgres():
    from tests.servers import start_postgres

    url, stop = start_postgres()
    try:
        upgrade(url)
        db = Database(url)
        fill(db)
        check_job_gauges(scrape(db))
        db.dispose()
    finally:
        stop()


def test_final_transitions_feed_the_event_counters():
    """Queue waits 0.3, 4 and 45 s (short), 200 s (long); RTF 0.05 and 0.4 (short), 1.5 (long)."""
    from diarist.metrics import ServiceMetrics

    m = ServiceMetrics()

    def final(status, queue="transcribe.short", wait=None, dur=10.0, rtf=None, code=None):
        created = NOW - timedelta(minutes=30)
        j = Job(id="job_x", status=status, queue=queue, duration_s=dur, created_at=created,
                started_at=created + timedelta(seconds=wait) if wait is not None else None, error_code=code)
        j.metrics = JobMetrics(rtf=rtf) if rtf is not None else None
        m.record_final(j)

    final("completed", wait=0.3, rtf=0.05)
    final("completed", wait=4.0, dur=20.0, rtf=0.4)
    final("failed", wait=45.0, code="decode_failed")
    final("completed", queue="transcribe.long", wait=200.0, dur=600.0, rtf=1.5)
    final("canceled", code="canceled")  # as diarist.jobs.cancel writes it; never started, so no queue wait
    for code in (200, 500, 404, None):
        m.record_webhook(code)
    fams = families(generate_latest(m.registry).decode())
    short = {"class": "short"}
    fin = "diarist_jobs_finished"
    assert sample(fams, fin, fin + "_total", status="completed", code="none", **short) == 2
    assert sample(fams, fin, fin + "_total", status="failed", code="decode_failed", **short) == 1
    assert sample(fams, fin, fin + "_total", status="canceled", code="canceled", **short) == 1
    qw = "diarist_job_queue_wait_seconds"
    assert sample(fams, qw, qw + "_bucket", le="0.1", **short) == 0
    assert sample(fams, qw, qw + "_bucket", le="0.5", **short) == 1
    assert sample(fams, qw, qw + "_bucket", le="5.0", **short) == 2
    assert sample(fams, qw, qw + "_bucket", le="60.0", **short) == 3
    assert sample(fams, qw, qw + "_count", **short) == 3
    assert sample(fams, qw, qw + "_sum", **short) == pytest.approx(49.3, abs=1e-6)
    assert sample(fams, qw, qw + "_sum", **{"class": "long"}) == pytest.approx(200.0)
    rtf = "diarist_job_rtf_ratio"
    assert sample(fams, rtf, rtf + "_bucket", le="0.05", **short) == 1
    assert sample(fams, rtf, rtf + "_bucket", le="0.5", **short) == 2
    assert sample(fams, rtf, rtf + "_count", **short) == 2
    assert sample(fams, rtf, rtf + "_bucket", le="1.0", **{"class": "long"}) == 0
    assert sample(fams, rtf, rtf + "_bucket", le="2.0", **{"class": "long"}) == 1
    audio = "diarist_audio_processed_seconds"
    assert sample(fams, audio, audio + "_total", **short) == 30.0
    assert sample(fams, audio, audio + "_total", **{"class": "long"}) == 600.0
    hooks = "diarist_webhook_deliveries"
    for outcome in ("success", "server_error", "client_error", "network_error"):
        assert sample(fams, hooks, hooks + "_total", outcome=outcome) == 1


def test_engine_collector_maps_stats_and_marks_a_down_engine():
    stats = {"e1": {"model": "tiny.en", "device": "cpu", "running_requests": 3, "waiting_requests": 2,
                    "kv_used_fraction": 0.25, "kv_tokens_total": 4096, "kv_tokens_used": 1024,
                    "tokens_per_s": 812.5, "steps": 40, "prefill_tokens": 900, "decode_tokens": 300,
                    "finished": 7, "errors": 1, "cuda_graph_replays": 33},
             "e2": None}
    reg = CollectorRegistry()
    reg.register(EngineCollector(lambda: stats))
    fams = families(generate_latest(reg).decode())
    assert sample(fams, "diarist_engine_up", "diarist_engine_up", engine="e1") == 1
    assert sample(fams, "diarist_engine_up", "diarist_engine_up", engine="e2") == 0
    assert sample(fams, "diarist_engine_running_requests", "diarist_engine_running_requests", engine="e1") == 3
    assert sample(fams, "diarist_engine_waiting_requests", "diarist_engine_waiting_requests", engine="e1") == 2
    assert sample(fams, "diarist_engine_kv_cache_usage_ratio", "diarist_engine_kv_cache_usage_ratio", engine="e1") == 0.25
    assert sample(fams, "diarist_engine_tokens_per_second", "diarist_engine_tokens_per_second", engine="e1") == 812.5
    assert sample(fams, "diarist_engine_cuda_graph_replays", "diarist_engine_cuda_graph_replays_total",
                  engine="e1") == 33
    assert sample(fams, "diarist_engine_decode_tokens", "diarist_engine_decode_tokens_total", engine="e1") == 300
    # a down engine has no other samples; an engine that does not report encoder-cache counters has none
    assert all(s.labels.get("engine") != "e2" for s in fams["diarist_engine_running_requests"].samples)
    assert not fams.get("diarist_engine_encoder_cache_hits") or not fams["diarist_engine_encoder_cache_hits"].samples


def check_conventions(text: str) -> None:
    """Counters end in _total, metric names are snake_case with the diarist_ prefix and no camelCase units."""
    import re

    fams = families(text)
    ours = {n: f for n, f in fams.items() if n.startswith("diarist_")}
    assert ours
    for name, f in ours.items():
        assert re.fullmatch(r"diarist_[a-z0-9_]+", name), name
        if f.type == "counter":
            assert all(s.name in (name + "_total", name + "_created") for s in f.samples), name
        if f.type == "histogram":
            assert name.endswith(("_seconds", "_ratio")), name
        assert not re.search(r"_(ms|milliseconds|minutes|hours|percent)(_|$)", name), name


def test_api_metrics_endpoint_includes_the_in_process_engine(stack, client):
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    check_conventions(r.text)
    fams = families(r.text)
    engine_id = next(iter(stack.app.state.engine_stats()))
    assert sample(fams, "diarist_engine_up", "diarist_engine_up", engine=engine_id) == 1
    cap = sample(fams, "diarist_engine_kv_cache_capacity_tokens", "diarist_engine_kv_cache_capacity_tokens",
                 engine=engine_id)
    assert cap == stack.engine.allocator.num_slots > 0
    assert "diarist_jobs" in fams and "diarist_job_queue_wait_seconds" in fams
    assert sample(fams, "diarist_broker_up", "diarist_broker_up") == 1
    assert sample(fams, "diarist_queue_messages", "diarist_queue_messages", queue="transcribe.short") >= 0
    assert sample(fams, "diarist_workers", "diarist_workers", **{"class": "embedded"}) == 1  # the in-process worker


def test_counters_never_go_down_when_a_job_is_deleted(stack, client, wait_job):
    """A completed job counts once at its transition; deleting it drops the gauge, never a ``_total``."""
    from tests.conftest import data_file

    def scrape_api() -> dict:
        return families(client.get("/metrics").text)

    def finished(fams) -> float:
        f = "diarist_jobs_finished"
        return sum(s.value for s in fams[f].samples if s.name == f + "_total"
                   and s.labels.get("status") == "completed") if f in fams else 0.0

    def audio(fams) -> float:
        f = "diarist_audio_processed_seconds"
        return sum(s.value for s in fams[f].samples if s.name == f + "_total") if f in fams else 0.0

    def completed_rows(fams) -> float:
        return sum(s.value for s in fams["diarist_jobs"].samples if s.labels["status"] == "completed")

    before = scrape_api()
    wav = data_file("en_short_yes/yes_1000ms.wav").read_bytes()
    r = client.post("/v1/jobs", files={"file": ("y.wav", wav)})
    assert r.status_code == 202
    job = wait_job(client, r.json()["id"])
    assert job["status"] == "completed"
    done = scrape_api()
    assert finished(done) == finished(before) + 1
    assert audio(done) == pytest.approx(audio(before) + job["duration"])
    assert completed_rows(done) == completed_rows(before) + 1
    sub = "diarist_jobs_submitted"
    assert sample(done, sub, sub + "_total", **{"class": "short"}) >= 1
    http = "diarist_http_requests"
    assert sample(done, http, http + "_total", method="POST", route="/v1/jobs", status="202") >= 1
    assert sample(done, http, http + "_total", method="GET", route="/v1/jobs/{job_id}", status="200") >= 1

    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 200
    after = scrape_api()
    assert completed_rows(after) == completed_rows(done) - 1  # a gauge of rows: down with the delete
    assert finished(after) == finished(done) and audio(after) == audio(done)  # counters: unchanged
    for fam in after.values():  # and no counter anywhere went down
        if fam.type == "counter" and fam.name in done:
            old = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in done[fam.name].samples}
            for s in fam.samples:
                if s.name.endswith("_total"):
                    assert s.value >= old.get((s.name, tuple(sorted(s.labels.items()))), 0.0), s


def test_engine_server_metrics(whisper_engine):
    from fastapi.testclient import TestClient

    from engine_server.server import create_engine_app

    with TestClient(create_engine_app(whisper_engine, engine_id="gpu0")) as c:
        r = c.get("/metrics")
    assert r.status_code == 200
    check_conventions(r.text)
    fams = families(r.text)
    assert sample(fams, "diarist_engine_up", "diarist_engine_up", engine="gpu0") == 1
    st = whisper_engine.stats()
    assert sample(fams, "diarist_engine_kv_cache_capacity_tokens", "diarist_engine_kv_cache_capacity_tokens",
                  engine="gpu0") == st["kv_tokens_total"]
    assert sample(fams, "diarist_engine_steps", "diarist_engine_steps_total", engine="gpu0") >= 0
    # CPU: the runner has no CUDA graphs, so the replay counter exists and is 0
    assert sample(fams, "diarist_engine_cuda_graph_replays", "diarist_engine_cuda_graph_replays_total",
                  engine="gpu0") == 0
    assert sample(fams, "diarist_engine_info", "diarist_engine_info", engine="gpu0", device="cpu") == 1


def test_a_database_outage_is_a_value_not_a_failed_scrape(tmp_path):
    """Postgres down: the scrape still answers, with ``diarist_database_up 0`` and no job gauges (so the
    broker, engine and process metrics stay visible during the outage); up, it is 1 beside the gauges."""
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    upgrade(url)
    db = Database(url)
    fill(db)
    fams = scrape(db)
    assert sample(fams, "diarist_database_up", "diarist_database_up") == 1
    check_job_gauges(fams)
    db.dispose()
    down = Database("postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2")
    try:
        fams = scrape(down)
    finally:
        down.dispose()
    assert sample(fams, "diarist_database_up", "diarist_database_up") == 0
    assert "diarist_jobs" not in fams and "diarist_webhook_jobs" not in fams
