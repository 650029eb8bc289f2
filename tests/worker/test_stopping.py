"""SIGTERM of a worker (issue 33 item 25): it takes no more jobs and hands its running ones back for
re-drive at once (the engine work aborted, the job ``queued`` again with its attempt not spent), instead of
waiting for every job in flight to finish."""

from __future__ import annotations

import io
import threading
import time

import pytest

from diarist.models import Job
from tests.worker.test_cancel import SilentEngine


@pytest.fixture
def rt(services):
    from worker.celery_app import CeleryDispatcher
    from worker.runtime import Runtime

    return Runtime(services=services, engine=SilentEngine(), dispatcher=CeleryDispatcher(services.settings))


def test_a_running_job_is_handed_back_and_nothing_new_is_claimed(rt, make_job):
    from worker.process import process_job

    rt.services.store.put_file("jobs/s/audio", io.BytesIO(b"RIFF...."))
    job_id = make_job(audio_key="jobs/s/audio")
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("outcome", process_job(rt, job_id)))
    t.start()
    assert rt.engine.started.wait(30)
    stop_at = time.monotonic()
    assert rt.leases.hand_back_all() == 1
    t.join(timeout=30)
    assert out["outcome"].state == "retry" and out["outcome"].delay_s == 0.0
    assert rt.engine.stopped_at is not None and rt.engine.stopped_at - stop_at < 5.0  # a hang bound
    with rt.services.db.session() as s:
        job = s.get(Job, job_id)
        assert (job.status, job.attempts, job.lease_owner, job.error_code) == ("queued", 0, None, None)
    # a message that arrives while the worker stops leaves the job queued, unclaimed
    assert process_job(rt, job_id).state == "retry"
    with rt.services.db.session() as s:
        assert (s.get(Job, job_id).status, s.get(Job, job_id).attempts) == ("queued", 0)
    assert rt.leases.held() == []


def test_the_transcribe_task_resends_a_handed_back_job(rt, make_job, monkeypatch):
    """The task turns the hand-back into a retry with no countdown: a new message for another worker."""
    from celery.exceptions import Retry

    from worker import tasks
    from worker.runtime import set_runtime

    rt.services.store.put_file("jobs/r/audio", io.BytesIO(b"RIFF...."))
    job_id = make_job(audio_key="jobs/r/audio")
    rt.leases.closing = True
    sent: list[float] = []

    def retry(countdown=None, **_kw):
        sent.append(countdown)
        return Retry()

    monkeypatch.setattr(tasks.transcribe, "retry", retry)
    set_runtime(rt)
    try:
        with pytest.raises(Retry):
            tasks.transcribe.run(job_id)
    finally:
        set_runtime(None)
    assert sent == [0.0]
