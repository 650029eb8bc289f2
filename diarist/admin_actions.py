"""Operator actions on jobs (cancel, retry, delete, redeliver a webhook), each written to the audit log.

Cancel reuses :func:`diarist.jobs.cancel`. Retry and redeliver are new transitions built the same way as
those in :mod:`diarist.jobs`: one conditional ``UPDATE … WHERE status = …``, so a retry can never race a
worker into running a job twice, and a second click is a no-op. Every call appends one
:class:`diarist.audit.AuditEntry`, whatever the outcome.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import update

from diarist import audit, jobs
from diarist.events import StatusEvent
from diarist.models import FINAL_STATES, Job, JobStatus, utcnow
from diarist.services import Services

log = logging.getLogger("diarist.admin")

ACTIONS = ("cancel", "retry", "delete", "redeliver")


@dataclass(frozen=True)
class Actor:
    """Who acts: the admin key (``key_id`` None when auth is off) and where the request came from."""

    key_id: str | None
    name: str | None
    remote_addr: str | None = None


@dataclass(frozen=True)
class Outcome:
    """``state``: ok (done) | noop (nothing to do in the job's state) | error; ``message`` for the operator."""

    state: str
    message: str


def allowed(job: Job) -> dict[str, bool]:
    """Which actions make sense for ``job`` in its current state (the dashboard shows only these)."""
    return {"cancel": job.status not in FINAL_STATES,
            "retry": job.status == JobStatus.FAILED.value,
            "delete": True,
            "redeliver": job.status in FINAL_STATES and bool(job.webhook_url)}


def perform(svc: Services, actor: Actor, action: str, job_id: str) -> Outcome:
    """Run ``action`` on ``job_id`` and audit it. Raises ValueError for an unknown action."""
    fn = {"cancel": cancel, "retry": retry, "delete": delete, "redeliver": redeliver}.get(action)
    if fn is None:
        raise ValueError(f"unknown action {action!r}; expected one of {ACTIONS}")
    try:
        out = fn(svc, job_id)
    except Exception as e:  # the audit must record failures too, then the caller shows them
        log.exception("admin action %s on %s failed", action, job_id)
        out = Outcome("error", f"{type(e).__name__}: {e}")
    audit.record(svc.db, action=action, outcome=out.state, actor_key_id=actor.key_id, actor_name=actor.name,
                 target_id=job_id, detail=out.message, remote_addr=actor.remote_addr)
    return out


def cancel(svc: Services, job_id: str) -> Outcome:
    """``queued|processing → canceled`` (the worker notices at its next progress write)."""
    if jobs.cancel(svc, job_id):
        return Outcome("ok", "canceled")
    return Outcome("noop", "the job is already final (or gone); nothing to cancel")


def retry(svc: Services, job_id: str) -> Outcome:
    """``failed → queued`` with a fresh attempt count, then enqueue it on its duration class' queue."""
    if svc.dispatcher is None:
        return Outcome("error", "this API process has no queue dispatcher")
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.status != JobStatus.FAILED.value:
            return Outcome("noop", f"only a failed job can be retried (it is {job.status if job else 'gone'})")
        if not job.audio_key:
            return Outcome("noop", "the job has no stored audio to retry from")
        prev_code, prev_message, queue = job.error_code, job.error_message, job.queue
        res = s.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.FAILED.value).values(
            status=JobStatus.QUEUED.value, attempts=0, progress=0.0, error_code=None, error_message=None,
            started_at=None, finished_at=None, transcript_key=None, incomplete=False, webhook_status=None,
            webhook_status_code=None, updated_at=utcnow()))
        if res.rowcount != 1:
            return Outcome("noop", "the job changed state meanwhile")
    try:
        svc.dispatcher.transcribe(job_id, queue)
    except Exception as e:  # noqa: BLE001 - put the job back as it was: a queued row with no message would never run
        with svc.db.session() as s:
            s.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value).values(
                status=JobStatus.FAILED.value, error_code=prev_code, error_message=prev_message,
                finished_at=utcnow(), updated_at=utcnow()))
        return Outcome("error", f"could not enqueue: {type(e).__name__}: {e}")
    svc.bus.publish(job_id, StatusEvent(JobStatus.QUEUED.value, 0.0).to_json())
    return Outcome("ok", f"requeued on {queue} (previous error: {prev_code})")


def delete(svc: Services, job_id: str) -> Outcome:
    """Cancel if still active, delete the audio and results, then the row (its metrics and deliveries)."""
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            return Outcome("noop", "no such job")
        active = job.status not in FINAL_STATES
    if active:
        jobs.cancel(svc, job_id)
    n = svc.store.delete_prefix(f"jobs/{job_id}/")
    with svc.db.session() as s:
        row = s.get(Job, job_id)
        if row is not None:
            s.delete(row)
    return Outcome("ok", f"deleted ({n} stored objects removed{', canceled first' if active else ''})")


def redeliver(svc: Services, job_id: str) -> Outcome:
    """Send the job's final-state webhook again as a new outbox message (new ``webhook-id``, attempts from 1)."""
    if svc.dispatcher is None:
        return Outcome("error", "this API process has no queue dispatcher")
    with svc.db.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.status not in FINAL_STATES or not job.webhook_url:
            return Outcome("noop", "only a finished job with a webhook_url can be redelivered")
        event = f"job.{job.status}"
        message_id = jobs.enqueue_webhook(s, job, event, svc.settings.queued_redrive_s)
    jobs.send_webhook(svc, job_id, message_id, event)
    return Outcome("ok", f"{event} enqueued as {message_id}")
