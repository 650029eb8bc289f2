"""Read-only queries behind the overview: queue depth, running jobs, recent outcomes, RTF and queue wait.

Everything comes from the job rows (Postgres or SQLite), so every API replica shows the same numbers.
Times: timezone-aware UTC; durations in seconds. A job's *class* is the last part of its queue name
(``transcribe.short`` → ``short``). Queue wait is ``started_at − created_at`` (the first time a worker
claimed it); RTF is the engine's ``processing_s / duration``. Percentiles use numpy's default (linear)
interpolation over the completed jobs of the last 24 h (at most ``SAMPLE_LIMIT`` newest).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from diarist.db import Database
from diarist.metrics import class_of
from diarist.models import ApiKey, Job, JobMetrics, JobStatus, WebhookDelivery, WorkerBeat

CLASSES = ("short", "long")
FINAL = (JobStatus.COMPLETED.value, JobStatus.FAILED.value, JobStatus.CANCELED.value)
SAMPLE_LIMIT = 20000
RUNNING_LIMIT = 50


def as_utc(dt: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if dt is None:
        return None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def seconds(a: datetime | None, b: datetime | None) -> float | None:
    """``b − a`` in seconds, or None when either is missing."""
    a, b = as_utc(a), as_utc(b)
    return None if a is None or b is None else (b - a).total_seconds()


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100) or None for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def _classes(extra: set[str]) -> list[str]:
    return list(CLASSES) + sorted(extra - set(CLASSES))


def queue_depth(s: Session) -> dict[str, dict[str, int]]:
    """``{class: {"queued": n, "processing": n}}`` right now."""
    rows = s.execute(select(Job.queue, Job.status, func.count()).where(
        Job.status.in_((JobStatus.QUEUED.value, JobStatus.PROCESSING.value))).group_by(Job.queue, Job.status))
    out: dict[str, dict[str, int]] = {}
    for queue, status, n in rows:
        out.setdefault(class_of(queue), {"queued": 0, "processing": 0})[status] += n
    return {c: out.get(c, {"queued": 0, "processing": 0}) for c in _classes(set(out))}


def running_jobs(s: Session, now: datetime, stall_after_s: float = 300.0) -> list[dict[str, Any]]:
    """The processing jobs, oldest start first, with progress in [0, 1] and elapsed seconds. ``stalled``:
    its progress has not moved for ``stall_after_s`` (since the claim, or the last progress write);
    ``orphaned``: its lease expired (the worker is gone; the sweeper re-drives it)."""
    q = (select(Job).where(Job.status == JobStatus.PROCESSING.value)
         .order_by(Job.started_at.asc()).limit(RUNNING_LIMIT))
    out = []
    for j in s.scalars(q):
        still = seconds(j.progress_at or j.started_at, now)
        lease_left = seconds(now, j.lease_expires_at)
        out.append({"id": j.id, "class": class_of(j.queue), "progress": float(j.progress or 0.0),
                    "duration_s": j.duration_s, "elapsed_s": seconds(j.started_at, now), "attempts": j.attempts,
                    "filename": j.filename, "stalled": still is not None and still >= stall_after_s,
                    "orphaned": lease_left is None or lease_left < 0})
    return out


def workers(s: Session, now: datetime, alive_s: float) -> list[dict[str, Any]]:
    """Every worker process that wrote a heartbeat in the last day: ``alive`` when seen within ``alive_s``
    (``Settings.worker_beat_bound_s``), its queues, whether it reaches its engine (None: no engine, e.g. a
    webhooks worker), jobs held (0 once it is gone: its jobs' leases lapse and the sweeper re-drives them)."""
    rows = s.scalars(select(WorkerBeat).where(WorkerBeat.seen_at >= now - timedelta(days=1))
                     .order_by(WorkerBeat.queues, WorkerBeat.name))
    out = []
    for w in rows:
        alive = (seconds(w.seen_at, now) or 0.0) <= alive_s
        out.append({"name": w.name, "queues": w.queues, "alive": alive, "seen_s_ago": seconds(w.seen_at, now),
                    "engine_url": w.engine_url, "engine_ok": w.engine_ok, "running": w.running if alive else 0})
    return out


def alive_workers(s: Session, now: datetime, alive_s: float) -> dict[str, int]:
    """Worker processes whose heartbeat is at most ``alive_s`` seconds old, by class. A heartbeat is named
    ``<node>:<pid>`` (worker/sweeper.py), the node ``<class>@<host>`` for ``diarist worker`` or ``embedded``."""
    out: dict[str, int] = {}
    for name in s.scalars(select(WorkerBeat.name).where(WorkerBeat.seen_at >= now - timedelta(seconds=alive_s))):
        klass = name.rsplit(":", 1)[0].split("@", 1)[0]
        out[klass] = out.get(klass, 0) + 1
    return out


def finished_counts(s: Session, since: datetime) -> dict[str, int]:
    """``{completed, failed, canceled}`` of jobs that finished at or after ``since``."""
    rows = s.execute(select(Job.status, func.count()).where(Job.finished_at >= since, Job.status.in_(FINAL))
                     .group_by(Job.status))
    got = dict(rows.all())
    return {k: int(got.get(k, 0)) for k in FINAL}


def audio_hours(s: Session, since: datetime | None = None) -> float:
    """Hours of audio in completed jobs (finished at or after ``since``, or ever)."""
    q = select(func.coalesce(func.sum(Job.duration_s), 0.0)).where(Job.status == JobStatus.COMPLETED.value)
    if since is not None:
        q = q.where(Job.finished_at >= since)
    return float(s.scalar(q) or 0.0) / 3600.0


def class_stats(s: Session, since: datetime) -> dict[str, dict[str, float | int | None]]:
    """Per class over jobs completed since ``since``: count, p50/p95 RTF and queue wait (seconds)."""
    q = (select(Job.queue, Job.created_at, Job.started_at, JobMetrics.rtf)
         .join(JobMetrics, JobMetrics.job_id == Job.id, isouter=True)
         .where(Job.status == JobStatus.COMPLETED.value, Job.finished_at >= since)
         .order_by(Job.finished_at.desc()).limit(SAMPLE_LIMIT))
    rtf: dict[str, list[float]] = {}
    wait: dict[str, list[float]] = {}
    seen: set[str] = set()
    for queue, created, started, r in s.execute(q):
        c = class_of(queue)
        seen.add(c)
        if r is not None:
            rtf.setdefault(c, []).append(float(r))
        w = seconds(created, started)
        if w is not None:
            wait.setdefault(c, []).append(max(0.0, w))
    out = {}
    for c in _classes(seen):
        r, w = rtf.get(c, []), wait.get(c, [])
        out[c] = {"completed": max(len(r), len(w)), "rtf_p50": percentile(r, 50), "rtf_p95": percentile(r, 95),
                  "queue_wait_p50_s": percentile(w, 50), "queue_wait_p95_s": percentile(w, 95)}
    return out


def webhook_failures(s: Session, since: datetime, limit: int = 10) -> dict[str, Any]:
    """Jobs whose webhook finally failed (since ``since``), those still retrying, and the latest bad attempts."""
    failed = s.scalar(select(func.count()).select_from(Job).where(Job.webhook_status == "failed",
                                                                  Job.updated_at >= since)) or 0
    retrying = s.scalar(select(func.count()).select_from(Job).where(Job.webhook_status == "retrying")) or 0
    bad = ((WebhookDelivery.status_code.is_(None)) | (WebhookDelivery.status_code < 200)
           | (WebhookDelivery.status_code >= 300))
    rows = s.scalars(select(WebhookDelivery).where(bad, WebhookDelivery.created_at >= since)
                     .order_by(WebhookDelivery.id.desc()).limit(limit))
    recent = [{"job_id": d.job_id, "attempt": d.attempt, "url": d.url, "status_code": d.status_code,
               "error": d.error, "at": as_utc(d.created_at).isoformat()} for d in rows]
    return {"failed_24h": int(failed), "retrying": int(retrying), "recent": recent}


def overview(db: Database, now: datetime | None = None, stall_after_s: float = 300.0,
             worker_alive_s: float = 45.0) -> dict[str, Any]:
    """Every number of the overview page, JSON-ready (``stall_after_s``: see :func:`running_jobs`;
    ``worker_alive_s``: see :func:`workers`)."""
    now = now or datetime.now(UTC)
    day = now - timedelta(days=1)
    with db.session() as s:
        return {
            "generated_at": now.isoformat(),
            "queues": queue_depth(s),
            "running": running_jobs(s, now, stall_after_s),
            "workers": workers(s, now, worker_alive_s),
            "finished": {"1h": finished_counts(s, now - timedelta(hours=1)), "24h": finished_counts(s, day)},
            "audio_hours": {"total": audio_hours(s), "24h": audio_hours(s, day)},
            "classes": class_stats(s, day),
            "webhooks": webhook_failures(s, day),
        }


def key_names(db: Database) -> dict[str, str]:
    """``{key id: name}`` of every API key (for filters and owner columns)."""
    with db.session() as s:
        return {k: n for k, n in s.execute(select(ApiKey.id, ApiKey.name).order_by(ApiKey.name))}
