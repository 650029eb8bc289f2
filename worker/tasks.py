"""Celery tasks: thin wrappers over :mod:`worker.process` and :mod:`worker.webhooks`.

Retries re-publish the message with a countdown (``self.retry``); the job row counts attempts, so the
bound holds even across worker crashes and redeliveries. When the retry cannot be published (the broker
is down) the row is made due at the retry's time and the sweeper sends it once the broker is back.
"""

from __future__ import annotations

import logging

from celery.exceptions import Retry
from celery.worker.request import Request

from diarist import jobs
from diarist.logs import job_context
from diarist.outages import classify
from worker.celery_app import app
from worker.process import outage_delay, process_job
from worker.runtime import runtime
from worker.webhooks import deliver

log = logging.getLogger("diarist.worker")


class JobRequest(Request):
    """Celery's request, acknowledged (or rejected) inside its job's log context: a line about its message,
    such as a lost ack after a Redis restart (worker/redis_broker.py), names the job. The job id is the
    task's first argument."""

    def _job_id(self) -> str | None:
        args = self.args
        return args[0] if args and isinstance(args[0], str) else None

    def acknowledge(self) -> None:
        with job_context(self._job_id()):
            super().acknowledge()

    def reject(self, requeue: bool = False) -> None:
        with job_context(self._job_id()):
            super().reject(requeue=requeue)


def _countdown(rt, delay_s: float) -> float:
    # A countdown message waits unacked in the worker; past Redis' visibility timeout it would be delivered
    # a second time, so no delay may come near it.
    return min(delay_s, rt.services.settings.visibility_timeout_s / 2)


def _retry(task, countdown: float, on_lost) -> str:
    """``task.retry(countdown)``; when the broker refuses the new message, ``on_lost()`` records that the
    work is due (best effort) and the current message is acked: the row, not the broker, holds the work."""
    try:
        raise task.retry(countdown=countdown)
    except Retry:
        raise
    except Exception as e:  # noqa: BLE001 - the broker is down: leave the re-drive to the sweeper
        log.warning("retry of %s not queued (%s: %s); the sweeper will re-drive it", task.request.id,
                    type(e).__name__, e)
        try:
            on_lost()
        except Exception:  # noqa: BLE001 - then the row's pickup deadline re-drives it
            log.warning("could not mark %s due; it is re-driven after queued_redrive_s", task.request.id)
        return "retry_lost"


@app.task(name="diarist.transcribe", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None,
          Request=JobRequest)
def transcribe(self, job_id: str) -> str:
    """Transcribe one job row (idempotent). Returns the outcome state."""
    rt = runtime()
    with job_context(job_id):  # every log line of the attempt carries the job id
        outcome = process_job(rt, job_id, redeliveries=self.request.retries or 0)
    if outcome.state == "retry":
        countdown = _countdown(rt, outcome.delay_s)
        return _retry(self, countdown, lambda: jobs.due_now(rt.services, job_id, countdown))
    return outcome.state


@app.task(name="diarist.deliver_webhook", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None,
          Request=JobRequest)
def deliver_webhook(self, job_id: str, event: str, message_id: str) -> str:
    """One delivery attempt of an outbox message (``message_id``); retries with backoff (bounded by
    settings, counted on the outbox row)."""
    rt = runtime()
    with job_context(job_id):
        try:
            result = deliver(rt, message_id)
        except Exception as e:
            dep = classify(e)
            if dep is None:
                raise
            # The database is down (the outbox row is untouched): try again later, no attempt spent.
            log.warning("webhook %s: %s unavailable, retrying", message_id, dep.value)
            return _retry(self, _countdown(rt, outage_delay(rt.services.settings, self.request.retries or 0)),
                          lambda: None)
    if result.state == "retry":
        countdown = _countdown(rt, result.delay_s)
        return _retry(self, countdown, lambda: jobs.webhook_due(rt.services, message_id))
    return result.state
