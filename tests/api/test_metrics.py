"""Prometheus /metrics: values computed from known job rows (SQLite and Postgres), engine metrics from a real
engine (embedded API and engine server), and names that follow the Prometheus conventions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import EngineCollector, JobsCollector
from diarist.db import Database, upgrade
from diarist.models import Job, JobMetrics, WebhookDelivery

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
    """Three started short jobs with queue waits 0.3, 4 and 45 s (two completed, RTF 0.05 and 0.4), one long
    completed job (RTF 1.5, wait 200 s), one queued and one failed short job; webhook attempts 200, 500, 404,
    and a network error."""
    def job(jid, status, queue="transcribe.short", wait=None, dur=10.0, rtf=None, hook=None):
        created = NOW - timedelta(minutes=30)
        started = created + timedelta(seconds=wait) if wait is not None else None
        j = Job(id=jid, status=status, queue=queue, duration_s=dur, created_at=created, updated_at=created,
                started_at=started, finished_at=NOW if status in ("completed", "failed") else None,
                webhook_status=hook)
        if rtf is not None:
            j.metrics = JobMetrics(rtf=rtf, processing_s=rtf * dur, finish_reason="stop", coverage=1.0)
        return j

    with db.session() as s:
        s.add_all([job("job_a", "completed", wait=0.3, dur=10.0, rtf=0.05, hook="delivered"),
                   job("job_b", "completed", wait=4.0, dur=20.0, rtf=0.4, hook="failed"),
                   job("job_c", "failed", wait=45.0, hook="failed"),
                   job("job_d", "completed", queue="transcribe.long", wait=200.0, dur=600.0, rtf=1.5),
                   job("job_e", "queued")])
        for i, (code, err) in enumerate([(200, None), (500, None), (404, None), (None, "ConnectError: refused")]):
            s.add(WebhookDelivery(job_id="job_b", message_id="msg_1", attempt=i + 1, url="http://h/", event="job.completed",
                                  status_code=code, error=err))


def scrape(db: Database) -> dict:
    reg = CollectorRegistry()
    reg.register(JobsCollector(db))
    return families(generate_latest(reg).decode())


def check_job_metrics(fams: dict) -> None:
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="completed", **{"class": "short"}) == 2
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="failed", **{"class": "short"}) == 1
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="queued", **{"class": "short"}) == 1
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="completed", **{"class": "long"}) == 1
    assert sample(fams, "diarist_jobs", "diarist_jobs", status="canceled", **{"class": "long"}) == 0

    qw = "diarist_job_queue_wait_seconds"
    short = {"class": "short"}
    assert sample(fams, qw, qw + "_bucket", le="0.1", **short) == 0
    assert sample(fams, qw, qw + "_bucket", le="0.5", **short) == 1
    assert sample(fams, qw, qw + "_bucket", le="5.0", **short) == 2
    assert sample(fams, qw, qw + "_bucket", le="60.0", **short) == 3
    assert sample(fams, qw, qw + "_bucket", le="+Inf", **short) == 3
    assert sample(fams, qw, qw + "_count", **short) == 3
    assert sample(fams, qw, qw + "_sum", **short) == pytest.approx(49.3, abs=1e-3)
    assert sample(fams, qw, qw + "_sum", **{"class": "long"}) == pytest.approx(200.0, abs=1e-3)

    rtf = "diarist_job_rtf_ratio"
    assert sample(fams, rtf, rtf + "_bucket", le="0.05", **short) == 1
    assert sample(fams, rtf, rtf + "_bucket", le="0.3", **short) == 1
    assert sample(fams, rtf, rtf + "_bucket", le="0.5", **short) == 2
    assert sample(fams, rtf, rtf + "_count", **short) == 2  # the failed job has no RTF
    assert sample(fams, rtf, rtf + "_bucket", le="1.0", **{"class": "long"}) == 0
    assert sample(fams, rtf, rtf + "_bucket", le="2.0", **{"class": "long"}) == 1

    audio = "diarist_audio_processed_seconds"
    assert sample(fams, audio, audio + "_total", **short) == 30.0
    assert sample(fams, audio, audio + "_total", **{"class": "long"}) == 600.0

    hooks = "diarist_webhook_deliveries"
    for outcome in ("success", "server_error", "client_error", "network_error"):
        assert sample(fams, hooks, hooks + "_total", outcome=outcome) == 1
    assert sample(fams, "diarist_webhook_jobs", "diarist_webhook_jobs", status="failed") == 2
    assert sample(fams, "diarist_webhook_jobs", "diarist_webhook_jobs", status="delivered") == 1


def test_job_metrics_from_rows_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    upgrade(url)
    db = Database(url)
    fill(db)
    check_job_metrics(scrape(db))
    db.dispose()


@pytest.mark.services
def test_job_metrics_from_rows_on_postgres():
    """The queue-wait SQL differs per dialect (julianday vs extract(epoch)); both must give the same."""
    from tests.servers import start_postgres

    url, stop = start_postgres()
    try:
        upgrade(url)
        db = Database(url)
        fill(db)
        check_job_metrics(scrape(db))
        db.dispose()
    finally:
        stop()


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
            assert all(s.name == name + "_total" for s in f.samples), name
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


def test_engine_server_metrics(whisper_engine):
    from fastapi.testclient import TestClient

    from api.engine_server import create_engine_app

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
