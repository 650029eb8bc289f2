"""The transcribe task's log lines carry the job id; an expected failure logs no traceback, a crash logs
exactly one (through the service's log handler, diarist/logs.py)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from diarist.logs import make_handler
from engine_server.client import JobFailure


class Engine:
    engine_id = "fake"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def transcribe(self, audio, options, on_event=None, cancel=None) -> dict:
        logging.getLogger("diarist.test.engine").info("transcribing")
        raise self.exc

    def ready(self) -> bool:
        return True


@pytest.fixture
def run_task(services, make_job):
    from worker import tasks
    from worker.celery_app import CeleryDispatcher
    from worker.runtime import Runtime, set_runtime

    root, buf = logging.getLogger(), io.StringIO()
    handler, level = make_handler("json", buf), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)

    def run(exc: Exception) -> tuple[str, str, list[dict]]:
        set_runtime(Runtime(services=services, engine=Engine(exc), dispatcher=CeleryDispatcher(services.settings)))
        services.store.put_bytes("jobs/l/audio", b"RIFF....")
        job_id = make_job(audio_key="jobs/l/audio")
        state = tasks.transcribe.run(job_id)
        return job_id, state, [json.loads(x) for x in buf.getvalue().splitlines()]

    yield run
    set_runtime(None)
    root.removeHandler(handler)
    root.setLevel(level)


def test_expected_failure_logs_no_traceback(run_task):
    job_id, state, out = run_task(JobFailure("decode_failed", "the file is not a readable media file"))
    assert state == "failed"
    mine = [o for o in out if o["logger"] == "diarist.test.engine"]
    assert mine and all(o["job_id"] == job_id for o in mine)
    assert not any("exc" in o for o in out)


def test_crash_logs_one_traceback_with_the_job_id(run_task):
    job_id, state, out = run_task(RuntimeError("a bug in the engine client"))
    assert state == "failed"
    with_tb = [o for o in out if "exc" in o]
    assert len(with_tb) == 1 and with_tb[0]["job_id"] == job_id
    assert "RuntimeError: a bug in the engine client" in with_tb[0]["exc"]


def test_a_lost_ack_after_a_redis_restart_is_one_line_with_the_job_id():
    """Issue 33 item 15: kombu's "Couldn't ack ... DetachedChannelError" (CRITICAL, with a traceback) for a
    job that ended while Redis restarted is one WARNING line naming the job, without a traceback; the
    acknowledgement runs through the task's real request class and kombu's real ``ack_log_error``."""
    from celery import Celery
    from celery.contrib.testing.mocks import TaskMessage
    from kombu.message import Message

    from diarist.settings import Settings
    from worker import redis_broker, tasks
    from worker.celery_app import configure

    configure(Settings(broker_url="redis://127.0.0.1:9/0"), Celery("probe"))  # installs the filter, as a worker does

    class Channel:
        no_ack_consumers = None

        def basic_ack(self, tag, multiple=False):
            raise redis_broker.DetachedChannelError("the broker connection of this channel was closed")

    job_id = "job_" + "b" * 32
    raw = TaskMessage("diarist.transcribe", args=[job_id])
    message = Message(body=raw.body, channel=Channel(), delivery_tag=7, content_type=raw.content_type,
                      content_encoding=raw.content_encoding, headers=raw.headers)
    request = tasks.JobRequest(message, on_ack=message.ack_log_error, app=tasks.app,
                               task=tasks.transcribe, connection_errors=(redis_broker.RedisConnectionError,))
    root, buf = logging.getLogger(), io.StringIO()
    handler, level = make_handler("json", buf), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        request.acknowledge()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    out = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert len(out) == 1, out
    line = out[0]
    assert line["level"] == "WARNING" and "exc" not in line and line["job_id"] == job_id
    assert line["message"].startswith("message 7 not acknowledged: the broker connection was lost "
                                      "(DetachedChannelError")


def test_other_celery_request_lines_pass_unchanged():
    from worker.redis_broker import LostAckFilter

    record = logging.LogRecord("celery.worker.request", logging.CRITICAL, __file__, 1, "Couldn't ack %r, reason:%r",
                               (3, OSError("disk")), None)
    assert LostAckFilter().filter(record) and record.levelno == logging.CRITICAL and record.msg.startswith("Couldn't")
