"""One attempt of a job against the row: idempotence, bounded engine retries, poison input, cancellation."""

from __future__ import annotations

import io

import pytest

from diarist import jobs
from diarist.models import Job
from engine_server.client import HttpEngineClient, JobFailure
from tests.conftest import wav_bytes
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


def test_stored_options_the_contract_refuses_fail_the_job_before_any_engine_call(rt, make_job):
    rt.services.store.put_file("jobs/a/audio", io.BytesIO(wav_bytes()))
    job_id = make_job(audio_key="jobs/a/audio", options={"num_speakers": "two"})
    out = process_job(rt, job_id)  # the engine client points at a closed port: a call would be an outage
    job = row(rt.services, job_id)
    assert (out.state, job.status, job.error_code) == ("failed", "failed", "invalid_request")
    assert "num_speakers must be an integer" in job.error_message


def test_unknown_job_is_skipped(rt):
    assert process_job(rt, "job_gone").state == "skipped"


def test_engine_down_waits_without_spending_attempts_then_fails_past_the_outage_bound(rt, make_job):
    rt.services.store.put_file("jobs/a/audio", io.BytesIO(wav_bytes()))
    job_id = make_job(audio_key="jobs/a/audio")
    for n in range(4):  # more than engine_attempts (2): an outage spends none
        out = process_job(rt, job_id, redeliveries=n)
        assert (out.state, out.code, out.delay_s) == ("retry", "engine_unavailable", min(0.25 * 2 ** n, 60.0))
        job = row(rt.services, job_id)
        assert (job.status, job.attempts, job.lease_owner) == ("queued", 0, None)
    assert job.outage_since is not None
    rt.services.settings.outage_bound_s = 0.0  # the outage has now lasted longer than the bound
    out = process_job(rt, job_id)
    job = row(rt.services, job_id)
    assert (out.state, job.status, job.error_code) == ("failed", "failed", "engine_unavailable")
    assert "outage_bound_s" in job.error_message and "unreachable" in job.error_message
    assert process_job(rt, job_id).state == "skipped"  # a redelivered message changes nothing


def test_engine_dropping_the_request_spends_attempts_then_fails_with_engine_error(rt, make_job):
    class DroppingEngine:
        engine_id = "fake"

        def transcribe(self, audio, options, on_event=None, cancel=None):
            raise JobFailure("engine_error", "engine server dropped the request", retryable=True)

    rt.engine = DroppingEngine()
    rt.services.store.put_file("jobs/a/audio", io.BytesIO(wav_bytes()))
    job_id = make_job(audio_key="jobs/a/audio")
    first = process_job(rt, job_id)
    assert (first.state, first.code, first.delay_s) == ("retry", "engine_error", 0.25)
    assert row(rt.services, job_id).status == "queued" and row(rt.services, job_id).attempts == 1
    second = process_job(rt, job_id)  # engine_attempts = 2
    assert (second.state, second.code) == ("failed", "engine_error")
    job = row(rt.services, job_id)
    assert (job.status, job.error_code, job.attempts) == ("failed", "engine_error", 2)
    assert "dropped" in job.error_message


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
    assert jobs.claim(services, job_id, "me") is None
    assert row(services, job_id).status == "canceled"


def test_job_failure_carries_code():
    e = JobFailure("too_long", "90 min max", retryable=False)
    assert (e.code, e.message, e.retryable) == ("too_long", "90 min max", False)


def test_a_job_canceled_mid_run_is_skipped_not_failed(rt, make_job):
    """The engine client gives up on a canceled job (HttpEngineClient closes its stream and raises
    ``canceled``); the attempt ends without touching the canceled row or scheduling a retry."""

    class CancelingEngine:  # the job is canceled while the engine streams; the client then gives up
        engine_id = "fake"

        def transcribe(self, audio, options, on_event=None, cancel=None):
            assert jobs.cancel(rt.services, job_id)
            on_event("segment", {"start": 0.0, "end": 0.5, "text": "hello"})  # the progress write sees it
            assert cancel.is_set()
            raise JobFailure("canceled", "the job was canceled; engine request closed")

    rt.engine = CancelingEngine()
    rt.services.store.put_file("jobs/c/audio", io.BytesIO(wav_bytes()))
    job_id = make_job(audio_key="jobs/c/audio")
    assert process_job(rt, job_id).state == "skipped"
    job = row(rt.services, job_id)
    assert (job.status, job.error_code, job.attempts) == ("canceled", "canceled", 1)


def test_a_live_lease_is_never_claimed_twice_and_an_expired_one_is_taken_over(services, make_job):
    from datetime import UTC, datetime, timedelta

    job_id = make_job()
    first = jobs.claim(services, job_id, "worker-a")
    assert first is not None and first.attempts == 1 and first.lease_owner == "worker-a"
    assert jobs.claim(services, job_id, "worker-b") is None  # a duplicate message for a running job
    assert jobs.renew_lease(services, job_id, "worker-a")
    with services.db.session() as s:  # worker-a died: its lease runs out
        s.get(Job, job_id).lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
    second = jobs.claim(services, job_id, "worker-b")
    assert second is not None and second.attempts == 2 and second.lease_owner == "worker-b"
    # worker-a comes back to life: it may not renew, report progress or complete
    assert not jobs.renew_lease(services, job_id, "worker-a")
    assert not jobs.set_progress(services, job_id, 0.5, owner="worker-a")
    assert not jobs.requeue(services, job_id, "worker-a", 1.0)
    assert row(services, job_id).lease_owner == "worker-b"


def test_database_down_at_claim_is_retried_and_touches_nothing(rt, make_job):
    from diarist.db import Database

    job_id = make_job()
    real = rt.services.db
    rt.services.db = Database("postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2")
    try:
        out = process_job(rt, job_id, redeliveries=2)
    finally:
        rt.services.db.dispose()
        rt.services.db = real
    assert (out.state, out.code, out.delay_s) == ("retry", "database_unavailable", 1.0)
    job = row(rt.services, job_id)
    assert (job.status, job.attempts) == ("queued", 0)


def test_storage_down_after_the_engine_is_waited_out_and_the_job_completes_once(rt, make_job, monkeypatch):
    """The transcript upload meets an S3 outage: the worker keeps the engine's result and retries the
    write (bounded), instead of leaving the job processing (the old behaviour)."""
    from botocore.exceptions import EndpointConnectionError

    from tests.worker.fakes import ResultEngine

    rt.engine = ResultEngine()
    rt.services.store.put_file("jobs/s/audio", io.BytesIO(wav_bytes()))
    job_id = make_job(audio_key="jobs/s/audio")
    real_put, failures = rt.services.store.put_bytes, []

    def flaky_put(key, data):
        if len(failures) < 2:
            failures.append(key)
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
        real_put(key, data)

    monkeypatch.setattr(rt.services.store, "put_bytes", flaky_put)
    monkeypatch.setattr("worker.process.outage_delay", lambda st, n: 0.01)
    assert process_job(rt, job_id).state == "completed"
    job = row(rt.services, job_id)
    assert (job.status, job.attempts, job.transcript_key) == ("completed", 1, f"jobs/{job_id}/transcript-1.json")
    assert failures == [job.transcript_key] * 2
    assert b"hello" in rt.services.store.get_bytes(job.transcript_key)


def test_a_row_without_audio_fails_audio_missing(rt, make_job):
    job_id = make_job(audio_key=None)
    assert (process_job(rt, job_id).state, row(rt.services, job_id).error_code) == ("failed", "audio_missing")


def test_stage_events_reach_the_job_event_stream(rt, make_job):
    """The pipeline's ``stage`` events go to the bus (SSE ``stage``) in order, beside the segments."""
    from diarist.contract.events import STAGES
    from tests.worker.fakes import ResultEngine

    class StagedEngine(ResultEngine):
        def transcribe(self, audio, options, on_event=None, cancel=None):
            for stage in STAGES:
                on_event("stage", {"stage": stage})
            return super().transcribe(audio, options, on_event, cancel)

    rt.engine = StagedEngine()
    rt.services.store.put_file("jobs/st/audio", io.BytesIO(wav_bytes()))
    job_id = make_job(audio_key="jobs/st/audio")
    sub = rt.services.bus.subscribe(job_id)
    try:
        assert process_job(rt, job_id).state == "completed"
        events = []
        while (ev := sub.get(timeout=0.2)) is not None:
            events.append(ev)
    finally:
        sub.close()
    assert [ev["stage"] for ev in events if ev["type"] == "stage"] == list(STAGES)
    kinds = [ev["type"] for ev in events]
    assert kinds.index("stage") < kinds.index("segment")
