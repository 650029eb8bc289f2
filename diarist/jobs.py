"""Job state transitions, shared by the API and the workers.

Every transition is one conditional ``UPDATE … WHERE status IN (…)``, so concurrent actors (a redelivered
Celery message, a cancel from the API, a second worker) can never move a job out of a final state or
complete it twice: the row is the source of truth, and the loser of a race sees ``rowcount == 0``.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import update

from diarist.models import FINAL_STATES, Job, JobMetrics, JobStatus, new_id, utcnow
from diarist.services import Services

log = logging.getLogger("diarist.jobs")

ACTIVE = (JobStatus.QUEUED.value, JobStatus.PROCESSING.value)
METRIC_FIELDS = ("queue_wait_s", "encoder_s", "prefill_s", "decode_s", "prompt_tokens", "output_tokens",
                 "processing_s", "rtf")


def _transition(svc: Services, job_id: str, allowed: tuple[str, ...], **values: Any) -> bool:
    with svc.db.session() as s:
        res = s.execute(update(Job).where(Job.id == job_id, Job.status.in_(allowed))
                        .values(updated_at=utcnow(), **values))
        return res.rowcount == 1


def claim(svc: Services, job_id: str) -> Job | None:
    """``queued|processing → processing`` and count the attempt; None when the job is gone or final."""
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.status in FINAL_STATES:
            return None
        res = s.execute(update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE)).values(
            status=JobStatus.PROCESSING.value, attempts=Job.attempts + 1, updated_at=utcnow(),
            started_at=job.started_at or utcnow()))
        if res.rowcount != 1:
            return None
        s.flush()
        s.refresh(job)
        s.expunge(job)
        return job


def requeue(svc: Services, job_id: str) -> bool:
    """``processing → queued`` before a retry."""
    return _transition(svc, job_id, (JobStatus.PROCESSING.value,), status=JobStatus.QUEUED.value)


def set_progress(svc: Services, job_id: str, progress: float) -> bool:
    """Record progress in [0, 1]; returns False when the job is no longer processing (e.g. canceled)."""
    return _transition(svc, job_id, (JobStatus.PROCESSING.value,), progress=max(0.0, min(1.0, progress)))


def complete(svc: Services, job_id: str, transcript_key: str, transcript: Any, result: dict,
             engine_id: str | None) -> bool:
    """``processing → completed`` with the transcript key and the metrics row; False if it lost a race."""
    metrics = result.get("metrics") or {}
    with svc.db.session() as s:
        res = s.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.PROCESSING.value).values(
            status=JobStatus.COMPLETED.value, transcript_key=transcript_key, progress=1.0, finished_at=utcnow(),
            updated_at=utcnow(), language=transcript.language, num_speakers=len(transcript.speakers),
            incomplete=transcript.incomplete, error_code=None, error_message=None))
        if res.rowcount != 1:
            return False
        row = s.get(JobMetrics, job_id) or JobMetrics(job_id=job_id)
        for k in METRIC_FIELDS:
            setattr(row, k, metrics.get(k))
        row.finish_reason = transcript.finish_reason
        row.coverage = transcript.coverage
        row.engine_id = engine_id
        row.extra = {k: v for k, v in metrics.items() if k not in METRIC_FIELDS and _jsonable(v)}
        s.merge(row)
    notify_final(svc, job_id)
    return True


def fail(svc: Services, job_id: str, code: str, message: str) -> bool:
    """``queued|processing → failed`` with a machine code; False when already final."""
    ok = _transition(svc, job_id, ACTIVE, status=JobStatus.FAILED.value, error_code=code,
                     error_message=message[:2000], finished_at=utcnow())
    if ok:
        notify_final(svc, job_id)
    return ok


def cancel(svc: Services, job_id: str) -> bool:
    """``queued|processing → canceled``; False when already final."""
    ok = _transition(svc, job_id, ACTIVE, status=JobStatus.CANCELED.value, finished_at=utcnow(),
                     error_code="canceled", error_message="the job was canceled by the client")
    if ok:
        notify_final(svc, job_id)
    return ok


def notify_final(svc: Services, job_id: str) -> None:
    """Publish the final status to SSE listeners and enqueue the webhook (if the job has one)."""
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            return
        svc.metrics.record_final(job)  # once per job: only the winner of the final transition gets here
        event = {"type": "status", "status": job.status, "progress": job.progress,
                 "error": {"code": job.error_code, "message": job.error_message} if job.error_code else None}
        url = job.webhook_url
        if url:
            job.webhook_status = "pending"
    svc.bus.publish(job_id, event)
    if url and svc.dispatcher is not None:
        try:
            svc.dispatcher.webhook(job_id, f"job.{event['status']}", new_id("msg"))
        except Exception:  # the job's state is already final; a broker hiccup must not undo it
            log.exception("could not enqueue the webhook of %s", job_id)


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))
