"""Unacknowledged messages left in Redis by a broker outage are harmless (issue 33 item 17; docs/operations.md,
"Unacknowledged messages").

A worker that held a message when the connection dropped could neither acknowledge nor give it back, so
Redis keeps it in its ``unacked`` hash. A worker's restore pass (every ``unacked_restore_interval``) puts it
back on its queue once it is older than the visibility timeout, and a worker runs it again. Its job was
finished meanwhile (the attempt ran on, against Postgres and S3), so the task's claim finds a final row and
does nothing: the job is not run twice, the engine is never called, and the message is acknowledged and gone.

A real ``redis-server`` (tests/servers.py), the real Celery worker (threads pool) and task, SQLite rows.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from diarist.models import Job
from tests.servers import Redis
from worker import routing

pytestmark = [pytest.mark.services]


class NoEngine:
    engine_id = "none"
    calls = 0

    def transcribe(self, *args, **kwargs):
        type(self).calls += 1
        raise AssertionError("a finished job's redelivered message reached the engine")

    def ready(self) -> bool:
        return True


def test_a_message_left_unacknowledged_is_redelivered_and_does_nothing(services, tmp_path):
    import redis as redis_py
    from celery import Celery
    from celery.signals import task_postrun

    import worker.tasks  # noqa: F401 - registers the tasks on the app
    from worker.celery_app import CeleryDispatcher, app, configure
    from worker.runtime import Runtime, set_runtime

    server = Redis()
    st = services.settings
    st.broker_url, st.visibility_timeout_s = server.url, 2
    configure(st)  # the worker's app (the tasks are registered on it)
    sender = configure(st, Celery("sender"))  # its own pools: the worker app's may still point at another broker
    finished = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    with services.db.session() as s:
        job = Job(status="completed", attempts=1, audio_key="jobs/u/audio", transcript_key="jobs/u/transcript-1.json",
                  finished_at=finished, duration_s=1.0)
        s.add(job)
    job_id = job.id
    CeleryDispatcher(st, sender).transcribe(job_id, routing.SHORT)
    r = redis_py.Redis.from_url(server.url)
    ran: list[tuple[list, str]] = []

    def record(args=None, retval=None, **_kw) -> None:
        ran.append((list(args or []), retval))

    task_postrun.connect(record, weak=False)
    controller = None
    try:
        # The worker that held it when Redis went away: took the message, never acknowledged or restored it.
        with sender.connection_for_read() as conn:
            channel = conn.channel()
            channel.qos.restore_at_shutdown = False  # as when the restore meets a dead connection
            held = conn.SimpleQueue(routing.SHORT, channel=channel).get(timeout=10)
            assert held.payload[0] == [job_id]
            assert r.hlen("unacked") == 1 and r.llen(routing.SHORT) == 0
        assert r.hlen("unacked") == 1  # left behind

        set_runtime(Runtime(services=services, engine=NoEngine(), dispatcher=CeleryDispatcher(st)))
        controller = app.WorkController(pool_cls="threads", concurrency=1, queues=[routing.SHORT],
                                        hostname="unacked@test", without_heartbeat=True, without_mingle=True,
                                        without_gossip=True, loglevel="WARNING")
        threading.Thread(target=controller.start, daemon=True).start()
        deadline = time.monotonic() + 60
        while not ran or r.hlen("unacked") or r.llen(routing.SHORT):
            assert time.monotonic() < deadline, "the unacknowledged message was never redelivered and settled"
            time.sleep(0.2)
    finally:
        sender.close()
        task_postrun.disconnect(record)
        if controller is not None:
            controller.stop(in_sighandler=False, exitcode=0)
        set_runtime(None)
        server.stop()
    assert ran == [([job_id], "skipped")]  # redelivered once, and a no-op
    assert NoEngine.calls == 0
    with services.db.session() as s:
        row = s.get(Job, job_id)
        assert (row.status, row.attempts, row.transcript_key) == ("completed", 1, "jobs/u/transcript-1.json")
        assert row.finished_at.replace(tzinfo=UTC) == finished
