"""Celery tasks: thin wrappers over :mod:`worker.process` and :mod:`worker.webhooks`.

Retries re-publish the message with a countdown (``self.retry``); the job row counts attempts, so the
bound holds even across worker crashes and redeliveries.
"""

from __future__ import annotations

from worker.celery_app import app
from worker.process import process_job
from worker.runtime import runtime
from worker.webhooks import deliver


@app.task(name="diarist.transcribe", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def transcribe(self, job_id: str) -> str:
    """Transcribe one job row (idempotent). Returns the outcome state."""
    outcome = process_job(runtime(), job_id)
    if outcome.state == "retry":
        raise self.retry(countdown=outcome.delay_s)
    return outcome.state


@app.task(name="diarist.deliver_webhook", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def deliver_webhook(self, job_id: str, event: str, message_id: str) -> str:
    """One delivery attempt of a job's webhook; retries with backoff (bounded by settings)."""
    result = deliver(runtime(), job_id, event, message_id, attempt=self.request.retries + 1)
    if result.state == "retry":
        raise self.retry(countdown=result.delay_s)
    return result.state
