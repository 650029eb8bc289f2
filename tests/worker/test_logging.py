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
