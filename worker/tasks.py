"""Celery tasks: thin wrappers over :mod:`worker.process` and :mod:`worker.webhooks`.

Retries re-publish the message with a countdown (``self.retry``); the job row counts attempts, so the
bound holds even across worker crashes and redeliveries.
"""

from __future__ import annotations

from diarist.logs import job_context
from worker.celery_app import app
from worker.process import process_job
from worker.runtime import runtime
from worker.webhooks import deliver


def _countdown(rt, delay_s: float) -> float:
    # A countdown message waits unacked in the worker; past Redis' visibility timeout it would be delivered
    # a second time, so no delay may come near it.
    return min(delay_s, rt.services.settings.visibility_timeout_s / 2)


@app.task(name="diarist.transcribe", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def transcribe(self, job_id: str) -> str:
    """Transcribe one job row (idempotent). Returns the outcome state."""
    rt = runtime()
    with job_context(job_id):  # every log line of the attempt carries the job id
        outcome = process_job(rt, job_id)
    if outcome.state == "retry":
        raise self.retry(countdown=_countdown(rt, outcome.delay_s))
    return outcome.state


@app.task(name="diarist.deliver_webhook", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def deliver_webhook(self, job_id: str, event: str, message_id: str) -> str:
    """One delivery attempt of a job's webhook; retries with backoff (bounded by settings)."""
    rt = runtime()
    with job_context(job_id):
        result = deliver(rt, job_id, event, message_id, attempt=self.request.retries + 1)
    if result.state == "retry":
        raise self.retry(countdown=_countdown(rt, result.delay_s))
    return result.state
