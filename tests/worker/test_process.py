"""One attempt of a job against the row: idempotence, bounded engine retries, poison input, cancellation."""

from __future__ import annotations

import io

import pytest

from diarist import jobs
from diarist.models import Job
from worker.engine_client import HttpEngineClient, JobFailure
from worker.process import process_job


@pytest.fixture
def rt(services):
    from worker.celery_app import CeleryDispatcher
    from worker.runtime import Runtime

    # A real HTTP client pointed at a closed loopback port: every call fails like a dead engine server.
    return Runtime(services=services, engine=HttpEngineClient("http://127.0.0.1:9", timeout_s=2),
                   dispatcher=CeleryDispatcher(services.settings))


def row(services, job_id) -> Job:
    with services.db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


@pytest.mark.parametrize("status", ["completed", "failed", "canceled"])
def test_final_jobs_are_never_reprocessed(rt, make_job, status):
    job_id = make_job(status=status)
    assert process_job(rt, job_id).state == "skipped"
    assert row(rt.services, job_id).status == status and row(rt.services, job_id).attempts == 0


def test_unknown_job_is_skipped(rt):
    assert process_job(rt, "job_gone").state == "skipped"


def test_engine_down_is_retried_then_fails_with_engine_error(rt, make_job):
    rt.services.store.put_file("jobs/a/audio", io.BytesIO(b"RIFF...."))
    job_id = make_job(audio_key="jobs/a/audio")
    first = process_job(rt, job_id)
    assert (first.state, first.code, first.delay_s) == ("retry", "engine_error", 0.25)
    assert row(rt.services, job_id).status == "queued" and row(rt.services, job_id).attempts == 1
    second = process_job(rt, job_id)  # engine_attempts = 2
    assert (second.state, second.code) == ("failed", "engine_error")
    job = row(rt.services, job_id)
    assert (job.status, job.error_code, job.attempts) == ("failed", "engine_error", 2)
    assert "unreachable" in job.error_message
    # A redelivered message (worker crash after the failure) changes nothing.
    assert process_job(rt, job_id).state == "skipped"


def test_attempt_budget_holds_across_redeliveries(rt, make_job):
    # A message redelivered after a worker was killed mid-job finds the job still processing.
    job_id = make_job(status="processing", attempts=2)
    out = process_job(rt, job_id)
    assert (out.state, out.code) == ("failed", "engine_error")


def test_missing_audio_fails_once(rt, make_job):
    job_id = make_job(audio_key="jobs/none/audio")
    out = process_job(rt, job_id)
    assert (out.state, out.code) == ("failed", "audio_missing")
    assert process_job(rt, job_id).state == "skipped"


def test_transitions_are_conditional(services, make_job):
    job_id = make_job()
    assert jobs.cancel(services, job_id)
    assert not jobs.cancel(services, job_id)
    assert not jobs.fail(services, job_id, "x", "y")
    assert jobs.claim(services, job_id) is None
    assert row(services, job_id).status == "canceled"


def test_job_failure_carries_code():
    e = JobFailure("too_long", "90 min max", retryable=False)
    assert (e.code, e.message, e.retryable) == ("too_long", "90 min max", False)


def test_a_job_canceled_mid_run_is_skipped_not_failed(rt, make_job):
    """The engine client gives up on a canceled job (HttpEngineClient closes its stream and raises
    ``canceled``); the attempt ends without touching the canceled row or scheduling a retry."""

    class CancelingEngine:  # the job is canceled while the engine streams; the client then gives up
        engine_id = "fake"

        def transcribe(self, audio, options, on_event=None, cancel=None, admission_class="default"):
            assert jobs.cancel(rt.services, job_id)
            on_event("segment", {"start": 0.0, "end": 0.5, "text": "hello"})  # the progress write sees it
            assert cancel.is_set()
            raise JobFailure("canceled", "the job was canceled; engine request closed")

    rt.engine = CancelingEngine()
    rt.services.store.put_file("jobs/c/audio", io.BytesIO(b"RIFF...."))
    job_id = make_job(audio_key="jobs/c/audio")
    assert process_job(rt, job_id).state == "skipped"
    job = row(rt.services, job_id)
    assert (job.status, job.error_code, job.attempts) == ("canceled", "canceled", 1)
