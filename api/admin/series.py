"""Time series for the overview charts, rebuilt from job timestamps (no sampler process needed).

- throughput (audio-s/s): audio seconds of the jobs completed in each bucket / bucket length;
- queue depth per class at the end of each bucket: the jobs whose ``[created_at, started_at)`` (or
  ``[created_at, finished_at)`` for one canceled before it started, or ``[created_at, now)`` for one still
  queued) contains that instant. A job sent back to the queue for a retry keeps its first ``started_at``,
  so its second wait is not counted.
"""

from __future__ import annotations

from bisect import bisect_left
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select

from api.admin.queries import CLASSES, as_utc, class_of
from diarist.db import Database
from diarist.models import Job, JobStatus

ROW_LIMIT = 50000


def last_hour(db: Database, now: datetime | None = None, bucket_s: int = 60, window_s: int = 3600) -> dict[str, Any]:
    """``{"t": [bucket end, unix s], "throughput": [audio-s/s], "depth": {class: [jobs]}, "bucket_s"}``.

    ``window_s / bucket_s`` points, oldest first; the last one ends at ``now``.
    """
    now = now or datetime.now(UTC)
    start = now - timedelta(seconds=window_s)
    n = max(1, window_s // bucket_s)
    ends = [start + timedelta(seconds=bucket_s * (i + 1)) for i in range(n)]
    end_ts = [e.timestamp() for e in ends]
    throughput = [0.0] * n
    depth: dict[str, list[int]] = {c: [0] * n for c in CLASSES}
    with db.session() as s:
        done = s.execute(select(Job.finished_at, Job.duration_s).where(
            Job.status == JobStatus.COMPLETED.value, Job.finished_at > start, Job.finished_at <= now)
            .limit(ROW_LIMIT))
        for finished, dur in done:
            i = min(n - 1, bisect_left(end_ts, as_utc(finished).timestamp()))  # bucket i is (end[i-1], end[i]]
            throughput[i] += float(dur or 0.0) / bucket_s
        waited = s.execute(select(Job.queue, Job.created_at, Job.started_at, Job.finished_at, Job.status).where(
            Job.created_at <= now,
            or_(Job.started_at.is_(None), Job.started_at > start),
            or_(Job.finished_at.is_(None), Job.finished_at > start)).limit(ROW_LIMIT))
        for queue, created, started, finished, status in waited:
            left = as_utc(created).timestamp()
            if started is not None:
                right = as_utc(started).timestamp()
            elif finished is not None:
                right = as_utc(finished).timestamp()
            elif status == JobStatus.QUEUED.value:
                right = float("inf")
            else:
                continue
            series = depth.setdefault(class_of(queue), [0] * n)
            for i, t in enumerate(end_ts):
                if left <= t < right:
                    series[i] += 1
    return {"t": end_ts, "bucket_s": bucket_s, "throughput": throughput, "depth": depth}
