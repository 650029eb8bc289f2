"""Job state transitions, shared by the API and the workers.

Every transition is one conditional ``UPDATE … WHERE status IN (…)``, so concurrent actors (a redelivered
Celery message, a cancel from the API, a second worker, the sweeper) can never move a job out of a final
state or complete it twice: the row is the source of truth, and the loser of a race sees ``rowcount == 0``.

Leases: a worker's claim writes a unique ``lease_owner`` and ``lease_expires_at = now + lease_s``; while it
runs it renews the lease (:func:`renew_lease`), and its own later writes (progress, requeue, complete) are
conditional on still owning it. A claim takes a queued job, or a processing one whose lease has expired
(its worker died), never a live one: a duplicate message for a running job does nothing. A final
transition writes the job's webhook into ``webhook_outbox`` in the same transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, update
from sqlalchemy.orm import Session

from diarist.contract.result import METRIC_FIELDS, TranscriptionResult
from diarist.events import StatusEvent
from diarist.models import FINAL_STATES, Job, JobMetrics, JobStatus, WebhookOutbox, new_id, utcnow
from diarist.services import Services

log = logging.getLogger("diarist.jobs")

ACTIVE = (JobStatus.QUEUED.value, JobStatus.PROCESSING.value)


def _transition(svc: Services, job_id: str, allowed: tuple[str, ...], **values: Any) -> bool:
    with svc.db.session() as s:
        res = s.execute(update(Job).where(Job.id == job_id, Job.status.in_(allowed))
                        .values(updated_at=utcnow(), **values))
        return res.rowcount == 1


def aware(dt: datetime | None) -> datetime | None:
    """``dt`` as an aware UTC datetime (SQLite hands back naive ones, in UTC)."""
    return dt.replace(tzinfo=UTC) if dt is not None and dt.tzinfo is None else dt


def _claimable(now: datetime):
    return or_(Job.status == JobStatus.QUEUED.value,
               and_(Job.status == JobStatus.PROCESSING.value,
                    or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now)))


def _owned(job_id: str, owner: str):
    return and_(Job.id == job_id, Job.status == JobStatus.PROCESSING.value, Job.lease_owner == owner)


def claim(svc: Services, job_id: str, owner: str) -> Job | None:
    """``queued → processing`` (or take over a processing job whose lease expired), count the attempt and
    take the lease as ``owner``. None when the job is gone, final, or running under a live lease."""
    now = utcnow()
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.status in FINAL_STATES:
            return None
        # synchronize_session=False: the row is refreshed below, and SQLAlchemy's in-Python evaluation of
        # the WHERE would compare SQLite's naive times with aware ones.
        res = s.execute(update(Job).where(Job.id == job_id, _claimable(now)).values(
            status=JobStatus.PROCESSING.value, attempts=Job.attempts + 1, updated_at=now,
            started_at=job.started_at or now, lease_owner=owner, progress_at=now,
            lease_expires_at=now + timedelta(seconds=svc.settings.lease_s))
            .execution_options(synchronize_session=False))
        if res.rowcount != 1:
            return None
        s.flush()
        s.refresh(job)
        s.expunge(job)
        return job


def renew_lease(svc: Services, job_id: str, owner: str) -> bool:
    """Extend ``owner``'s lease by ``lease_s``; False when it no longer holds it (canceled, taken over)."""
    now = utcnow()
    with svc.db.session() as s:
        res = s.execute(update(Job).where(_owned(job_id, owner)).values(
            lease_expires_at=now + timedelta(seconds=svc.settings.lease_s), updated_at=Job.updated_at))
        return res.rowcount == 1


def requeue(svc: Services, job_id: str, owner: str, delay_s: float, *, counted: bool = True,
            outage: bool = False) -> bool:
    """``processing → queued`` by the lease ``owner`` before a retry in ``delay_s`` seconds.

    ``counted=False`` gives the attempt back (a dependency was down: not the job's fault); ``outage`` starts
    the job's outage clock (``outage_since``) if it is not running. The queued row is due for pickup by
    ``now + delay_s + queued_redrive_s`` (after that the sweeper sends it again)."""
    now = utcnow()
    values: dict[str, Any] = {"status": JobStatus.QUEUED.value, "lease_owner": None, "updated_at": now,
                              "lease_expires_at": now + timedelta(seconds=delay_s + svc.settings.queued_redrive_s)}
    if not counted:
        values["attempts"] = Job.attempts - 1
    if outage:
        values["outage_since"] = func.coalesce(Job.outage_since, now)
    with svc.db.session() as s:
        return s.execute(update(Job).where(_owned(job_id, owner)).values(**values)).rowcount == 1


def due_now(svc: Services, job_id: str, delay_s: float = 0.0) -> bool:
    """A queued job whose message could not be sent: make it due for the sweeper in ``delay_s``."""
    return _transition(svc, job_id, (JobStatus.QUEUED.value,),
                       lease_expires_at=utcnow() + timedelta(seconds=delay_s))


def clear_outage(svc: Services, job_id: str, owner: str) -> None:
    """The attempt got past every dependency (the engine answered): reset the outage clock."""
    with svc.db.session() as s:
        s.execute(update(Job).where(_owned(job_id, owner), Job.outage_since.is_not(None))
                  .values(outage_since=None, updated_at=Job.updated_at))


def set_progress(svc: Services, job_id: str, progress: float, owner: str | None = None) -> bool:
    """Record progress in [0, 1] (and ``progress_at``); False when the job is no longer processing (e.g.
    canceled) or, with ``owner``, when that attempt no longer holds the lease."""
    where = _owned(job_id, owner) if owner is not None else and_(Job.id == job_id,
                                                                   Job.status == JobStatus.PROCESSING.value)
    now = utcnow()
    with svc.db.session() as s:
        return s.execute(update(Job).where(where).values(progress=max(0.0, min(1.0, progress)), progress_at=now,
                                                         updated_at=now)).rowcount == 1


def complete(svc: Services, job_id: str, transcript_key: str, transcript: Any, result: TranscriptionResult,
             engine_id: str | None, owner: str | None = None) -> bool:
    """``processing → completed`` with the transcript key and the metrics row; False if it lost a race
    (with ``owner``: also when that attempt no longer holds the lease)."""
    where = _owned(job_id, owner) if owner is not None else and_(Job.id == job_id,
                                                                   Job.status == JobStatus.PROCESSING.value)
    with svc.db.session() as s:
        res = s.execute(update(Job).where(where).values(
            status=JobStatus.COMPLETED.value, transcript_key=transcript_key, progress=1.0, finished_at=utcnow(),
            updated_at=utcnow(), language=transcript.language, num_speakers=len(transcript.speakers),
            incomplete=transcript.incomplete, error_code=None, error_message=None, lease_owner=None,
            lease_expires_at=None, outage_since=None))
        if res.rowcount != 1:
            return False
        row = s.get(JobMetrics, job_id) or JobMetrics(job_id=job_id)
        for k in METRIC_FIELDS:
            setattr(row, k, getattr(result.metrics, k))
        row.finish_reason = transcript.finish_reason
        row.coverage = transcript.coverage
        row.engine_id = engine_id
        row.extra = {k: v for k, v in result.pipeline_metrics.items() if _jsonable(v)}
        s.merge(row)
        final = _record_final(svc, s, job_id)
    _announce(svc, final)
    return True


def _final(svc: Services, job_id: str, allowed: tuple[str, ...], **values: Any) -> bool:
    """A final transition and its outbox row in one transaction, then the announcements."""
    with svc.db.session() as s:
        res = s.execute(update(Job).where(Job.id == job_id, Job.status.in_(allowed)).values(
            updated_at=utcnow(), finished_at=utcnow(), lease_owner=None, lease_expires_at=None, **values))
        if res.rowcount != 1:
            return False
        final = _record_final(svc, s, job_id)
    _announce(svc, final)
    return True


def fail(svc: Services, job_id: str, code: str, message: str) -> bool:
    """``queued|processing → failed`` with a machine code; False when already final."""
    return _final(svc, job_id, ACTIVE, status=JobStatus.FAILED.value, error_code=code, error_message=message[:2000])


def cancel(svc: Services, job_id: str) -> bool:
    """``queued|processing → canceled``; False when already final."""
    return _final(svc, job_id, ACTIVE, status=JobStatus.CANCELED.value, error_code="canceled",
                  error_message="the job was canceled by the client")


@dataclass(frozen=True)
class _Final:
    """What to announce after a final transition committed: the SSE event and the outbox message."""

    job_id: str
    event: dict
    message_id: str | None
    event_name: str


def _record_final(svc: Services, s: Session, job_id: str) -> _Final:
    """Inside the final transition's transaction: the job's webhook message goes into the outbox."""
    s.flush()
    job = s.get(Job, job_id)
    s.refresh(job)
    svc.metrics.record_final(job)  # once per job: only the winner of the final transition gets here
    event = StatusEvent.of(job).to_json()
    message_id = None
    if job.webhook_url:
        message_id = enqueue_webhook(s, job, f"job.{job.status}", svc.settings.queued_redrive_s)
    return _Final(job_id, event, message_id, f"job.{job.status}")


def enqueue_webhook(s: Session, job: Job, event: str, redrive_s: float) -> str:
    """Add one webhook message for ``job`` to the outbox (in the caller's transaction); returns its id.
    It is due for pickup within ``redrive_s`` seconds (:func:`send_webhook` hands it to the broker), else
    the sweeper sends it again."""
    now = utcnow()
    msg = WebhookOutbox(id=new_id("msg"), job_id=job.id, event=event, state="pending", next_attempt_at=now,
                        locked_until=now + timedelta(seconds=redrive_s))
    s.add(msg)
    job.webhook_status = "pending"
    return msg.id


def send_webhook(svc: Services, job_id: str, message_id: str, event: str, countdown: float = 0.0) -> None:
    """Hand an outbox message to the broker (to run in ``countdown`` seconds); on failure make it due for
    the sweeper (logged)."""
    if svc.dispatcher is None:
        return
    try:
        svc.dispatcher.webhook(job_id, event, message_id, countdown=countdown)
    except Exception as e:  # noqa: BLE001 - the outbox row holds the message; the sweeper sends it when the broker is back
        log.warning("webhook %s of %s not queued (%s: %s); the sweeper will send it", message_id, job_id,
                    type(e).__name__, e)
        try:
            webhook_due(svc, message_id)
        except Exception:  # noqa: BLE001 - then it becomes due after queued_redrive_s
            log.warning("could not mark webhook %s due; it is re-sent after queued_redrive_s", message_id)


def webhook_due(svc: Services, message_id: str) -> bool:
    """A pending outbox message whose broker message could not be sent: due for the sweeper at its
    ``next_attempt_at``."""
    with svc.db.session() as s:
        return s.execute(update(WebhookOutbox).where(WebhookOutbox.id == message_id, WebhookOutbox.state == "pending")
                         .values(locked_until=None)).rowcount == 1


def _announce(svc: Services, final: _Final) -> None:
    svc.bus.publish(final.job_id, final.event)
    if final.message_id is not None:
        send_webhook(svc, final.job_id, final.message_id, final.event_name)


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))
