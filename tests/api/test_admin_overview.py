"""The overview's numbers, chart series, jobs-table filters and job timeline, from known rows at a fixed time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from api.admin import listing, queries, series, timeline
from diarist.db import Database, upgrade
from diarist.models import Job, JobMetrics, WebhookDelivery

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(minutes_ago: float) -> datetime:
    return NOW - timedelta(minutes=minutes_ago)


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'o.sqlite3'}"
    upgrade(url)
    d = Database(url)
    yield d
    d.dispose()


def add(db: Database, jid: str, status: str, queue: str = "transcribe.short", created=None, started=None,
        finished=None, dur: float = 60.0, rtf: float | None = None, **kw) -> None:
    with db.session() as s:
        j = Job(id=jid, status=status, queue=queue, duration_s=dur, created_at=created or at(5),
                updated_at=finished or NOW, started_at=started, finished_at=finished, **kw)
        if rtf is not None:
            j.metrics = JobMetrics(rtf=rtf)
        s.add(j)


@pytest.fixture
def rows(db):
    # short, completed in the last hour: RTF 0.1 … 0.4, queue waits 1, 2, 3, 10 s; audio 60 s each
    for i, (rtf, wait) in enumerate([(0.1, 1), (0.2, 2), (0.3, 3), (0.4, 10)]):
        c = at(50 - i)
        add(db, f"job_s{i}", "completed", created=c, started=c + timedelta(seconds=wait),
            finished=at(40 - i), rtf=rtf)
    # long, completed 3 h ago: 1800 s of audio, RTF 0.05, waited 60 s
    add(db, "job_l0", "completed", queue="transcribe.long", created=at(200), started=at(199), finished=at(180),
        dur=1800.0, rtf=0.05)
    add(db, "job_old", "completed", created=at(3000), started=at(2999), finished=at(2990), dur=7200.0, rtf=0.2)
    add(db, "job_f", "failed", created=at(20), started=at(19), finished=at(18), error_code="decode_failed",
        webhook_url="http://h/", webhook_status="failed")
    add(db, "job_c", "canceled", created=at(300), finished=at(200))  # canceled while queued, 2 h ago
    add(db, "job_q1", "queued", created=at(10))
    add(db, "job_q2", "queued", created=at(2))
    add(db, "job_ql", "queued", queue="transcribe.long", created=at(30))
    add(db, "job_p", "processing", created=at(8), started=at(6), progress=0.5, dur=600.0)
    with db.session() as s:
        s.add(WebhookDelivery(job_id="job_f", message_id="m", attempt=1, url="http://h/", event="job.failed",
                              status_code=500, created_at=at(17)))


def test_overview_numbers(db, rows):
    o = queries.overview(db, now=NOW)
    assert o["queues"]["short"] == {"queued": 2, "processing": 1}
    assert o["queues"]["long"] == {"queued": 1, "processing": 0}
    assert o["running"] == [{"id": "job_p", "class": "short", "progress": 0.5, "duration_s": 600.0,
                             "elapsed_s": 360.0, "attempts": 0, "filename": None,
                             "stalled": True, "orphaned": True}]  # no progress for 6 min; no lease
    assert o["finished"]["1h"] == {"completed": 4, "failed": 1, "canceled": 0}
    assert o["finished"]["24h"] == {"completed": 5, "failed": 1, "canceled": 1}
    assert o["audio_hours"]["24h"] == pytest.approx((4 * 60 + 1800) / 3600)
    assert o["audio_hours"]["total"] == pytest.approx((4 * 60 + 1800 + 7200) / 3600)
    short = o["classes"]["short"]
    assert short["completed"] == 4
    # numpy linear interpolation: p50 of 0.1..0.4 is 0.25, p95 is 0.4 - 0.05 * 0.1 * 3 = 0.385
    assert short["rtf_p50"] == pytest.approx(0.25) and short["rtf_p95"] == pytest.approx(0.385)
    assert short["queue_wait_p50_s"] == pytest.approx(2.5) and short["queue_wait_p95_s"] == pytest.approx(8.95)
    assert o["classes"]["long"]["rtf_p50"] == pytest.approx(0.05)
    assert o["classes"]["long"]["queue_wait_p50_s"] == pytest.approx(60.0)
    assert o["webhooks"]["failed_24h"] == 1
    assert o["webhooks"]["recent"][0]["job_id"] == "job_f" and o["webhooks"]["recent"][0]["status_code"] == 500


def test_series_throughput_and_queue_depth(db, rows):
    s = series.last_hour(db, now=NOW)
    assert len(s["t"]) == 60 and s["t"][-1] == NOW.timestamp() and s["bucket_s"] == 60
    # four 60 s jobs finished 40, 39, 38, 37 minutes ago (each exactly at a bucket's end, which belongs to
    # the bucket it ends): 1 audio-s/s in buckets 19..22
    nonzero = {i: v for i, v in enumerate(s["throughput"]) if v}
    assert sorted(nonzero) == [19, 20, 21, 22] and all(v == pytest.approx(1.0) for v in nonzero.values())
    # short queue at NOW: job_q1 (10 min) and job_q2 (2 min); job_p waited from 8 to 6 min ago
    assert s["depth"]["short"][-1] == 2
    assert s["depth"]["short"][59 - 7] == 2  # 7 min ago: job_q1 and job_p
    assert s["depth"]["short"][59 - 9] == 1  # 9 min ago: job_q1 only
    assert s["depth"]["short"][59 - 11] == 0
    assert s["depth"]["long"][-1] == 1 and s["depth"]["long"][59 - 31] == 0


def test_listing_filters_and_pages(db, rows):
    page = listing.job_page(db, listing.Filters(status="queued").clean(), 1, 2, now=NOW)
    assert page["total"] == 3 and page["pages"] == 2 and [j.id for j in page["rows"]] == ["job_q2", "job_q1"]
    assert [j.id for j in listing.job_page(db, listing.Filters(status="queued"), 2, 2, now=NOW)["rows"]] == ["job_ql"]
    assert listing.job_page(db, listing.Filters(cls="long").clean(), 1, 50, now=NOW)["total"] == 2
    assert listing.job_page(db, listing.Filters(range="1h").clean(), 1, 50, now=NOW)["total"] == 9
    since = listing.Filters(since=at(15).strftime("%Y-%m-%dT%H:%M"), until=at(5).strftime("%Y-%m-%dT%H:%M"))
    assert {j.id for j in listing.job_page(db, since.clean(), 1, 50, now=NOW)["rows"]} == {"job_q1", "job_p"}
    assert [j.id for j in listing.job_page(db, listing.Filters(q="s2").clean(), 1, 50, now=NOW)["rows"]] == ["job_s2"]
    assert listing.job_page(db, listing.Filters(q="%").clean(), 1, 50, now=NOW)["total"] == 0  # LIKE is escaped
    assert listing.job_page(db, listing.Filters(status="nope").clean(), 99, 50, now=NOW)["page"] == 1


def test_timeline_phases_in_order_and_summing_to_the_span():
    job = SimpleNamespace(created_at=at(2), started_at=at(2) + timedelta(seconds=20),
                          finished_at=at(2) + timedelta(seconds=80))
    m = SimpleNamespace(queue_wait_s=2.0, encoder_s=5.0, prefill_s=3.0, decode_s=40.0)
    parts = timeline.phases(job, m, now=NOW)
    assert [(p["name"], p["seconds"]) for p in parts] == [
        ("queued", 20.0), ("engine wait", 2.0), ("encoding", 5.0), ("prefill", 3.0), ("decode", 40.0), ("stored", 10.0)]
    bar = timeline.bar(parts)
    assert bar["total_s"] == 80.0
    assert [round(p["x"], 2) for p in bar["parts"]] == [0.0, 250.0, 275.0, 337.5, 375.0, 875.0]
    # the cascade's VAD and diarization seconds (job_metrics.extra) get their own phases
    m.extra = {"vad_s": 1.5, "diarization_s": 2.5, "windows": 3}
    assert [(p["name"], p["seconds"]) for p in timeline.phases(job, m, now=NOW)] == [
        ("queued", 20.0), ("vad", 1.5), ("engine wait", 2.0), ("encoding", 5.0), ("prefill", 3.0),
        ("decode", 40.0), ("diarization", 2.5), ("stored", 6.0)]
    # the speakers' voice vectors (known speakers) are a phase of their own, not "stored"
    m.extra["speaker_embedding_s"] = 4.0
    assert [(p["name"], p["seconds"]) for p in timeline.phases(job, m, now=NOW)][-2:] == [
        ("voices", 4.0), ("stored", 2.0)]
    # still running: queued then "processing" up to now; never started: queued only
    running = SimpleNamespace(created_at=at(2), started_at=at(1), finished_at=None)
    assert [(p["name"], p["seconds"]) for p in timeline.phases(running, None, now=NOW)] == [
        ("queued", 60.0), ("processing", 60.0)]
    waiting = SimpleNamespace(created_at=at(2), started_at=None, finished_at=None)
    assert [p["name"] for p in timeline.phases(waiting, None, now=NOW)] == ["queued"]


def test_stalled_jobs_and_worker_liveness(db):
    from diarist.models import WorkerBeat

    add(db, "job_live", "processing", started=at(10), progress=0.4, progress_at=at(1), lease_expires_at=at(-1))
    add(db, "job_stuck", "processing", started=at(10), progress=0.4, progress_at=at(6), lease_expires_at=at(-1))
    with db.session() as s:
        s.add(WorkerBeat(name="short@a:1", queues="transcribe.short", engine_url="http://e", engine_ok=True,
                         running=2, started_at=at(60), seen_at=at(0.25)))
        s.add(WorkerBeat(name="short@b:2", queues="transcribe.short", engine_url="http://e", engine_ok=False,
                         running=3, started_at=at(60), seen_at=at(5)))  # its last beat held 3 jobs
    o = queries.overview(db, now=NOW, stall_after_s=300.0, worker_alive_s=45.0)
    flags = {j["id"]: (j["stalled"], j["orphaned"]) for j in o["running"]}
    assert flags == {"job_live": (False, False), "job_stuck": (True, False)}
    assert [(w["name"], w["alive"], w["engine_ok"], w["running"]) for w in o["workers"]] == [
        ("short@a:1", True, True, 2), ("short@b:2", False, False, 0)]  # a gone worker holds nothing
