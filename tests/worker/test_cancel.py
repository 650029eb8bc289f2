"""A job canceled while its engine call runs: the worker's cancel watch reads the row, sets the attempt's
token, the engine client stops, and the attempt ends as skipped with the row left ``canceled``. The engine
client here sends no events at all (as during prefill, or while all windows decode together), which is
where a cancel noticed only on progress writes was never seen."""

from __future__ import annotations

import io
import threading
import time

import pytest

from diarist import jobs
from diarist.contract.options import TranscribeOptions
from diarist.models import Job
from engine_server.client import JobFailure
from tests.conftest import wav_bytes
from worker.cancel import CancelToken
from worker.process import process_job


class SilentEngine:
    """An engine client that emits nothing and works until canceled (or ``limit_s`` passes)."""

    engine_id = "silent"

    def __init__(self, limit_s: float = 30.0) -> None:
        self.limit_s = limit_s
        self.started = threading.Event()
        self.stopped_at: float | None = None

    def transcribe(self, audio, options, on_event=None, cancel: CancelToken | None = None) -> dict:
        done = threading.Event()
        cancel.add_callback(done.set)
        self.started.set()
        if done.wait(self.limit_s):
            self.stopped_at = time.monotonic()
            raise JobFailure("canceled", "the job was canceled")
        raise JobFailure("engine_error", "the test engine was never canceled", retryable=False)

    def ready(self) -> bool:
        return True


@pytest.fixture
def rt(services):
    from worker.celery_app import CeleryDispatcher
    from worker.runtime import Runtime

    services.settings.cancel_poll_s = 0.05
    return Runtime(services=services, engine=SilentEngine(), dispatcher=CeleryDispatcher(services.settings))


def test_cancel_of_a_running_job_stops_its_engine_call(rt, make_job):
    rt.services.store.put_file("jobs/c/audio", io.BytesIO(b"RIFF...."))
    job_id = make_job(audio_key="jobs/c/audio")
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("outcome", process_job(rt, job_id)))
    t.start()
    assert rt.engine.started.wait(30)
    canceled_at = time.monotonic()
    assert jobs.cancel(rt.services, job_id)
    t.join(timeout=30)
    assert out["outcome"].state == "skipped"
    assert rt.engine.stopped_at is not None and rt.engine.stopped_at - canceled_at < 5.0  # a hang bound
    with rt.services.db.session() as s:
        job = s.get(Job, job_id)
        assert (job.status, job.error_code, job.transcript_key) == ("canceled", "canceled", None)


def test_token_runs_each_callback_once_even_when_added_late():
    token, calls = CancelToken(), []
    remove = token.add_callback(lambda: calls.append("a"))
    token.add_callback(lambda: calls.append("b"))()  # unregistered at once: never runs
    remove_b = token.add_callback(lambda: 1 / 0)  # a failing callback does not stop the others
    token.add_callback(lambda: calls.append("c"))
    token.cancel()
    token.cancel()
    assert calls == ["a", "c"] and token.is_set()
    token.add_callback(lambda: calls.append("late"))  # after the cancel: runs at once
    assert calls == ["a", "c", "late"]
    remove()
    remove_b()


def test_engine_request_carries_options_in_a_header_not_the_url(tmp_path):
    """The prompt must not reach any access log: the worker sends options (and the job id, for the engine's
    log lines) as headers; the URL is the bare path."""
    import json

    from diarist.logs import job_context
    from engine_server.client import HttpEngineClient
    from tests.stand_in_engine import stand_in_engine
    from tests.worker.fakes import engine_result

    # a well-formed result (diarist.contract.result.check_result), with no segments
    result = [{"type": "result", "result": {**engine_result(), "segments": []}}]
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(0.5))
    with stand_in_engine(lambda: result) as (url, requests), job_context("job_" + "0" * 32):
        out = HttpEngineClient(url).transcribe(audio, TranscribeOptions(prompt="Quuxwidget Ünïcode", num_speakers=2))
    seen = requests[0]
    assert out.segments == [] and out.pipeline_metrics["worker_decode_s"] >= 0
    assert seen["path"] == "/internal/transcribe"
    # the worker decoded the file: the body is its samples, described by the PCM header
    assert json.loads(seen["headers"]["x-diarist-pcm"])["frames"] == 8000
    assert seen["headers"]["content-length"] == str(8000 * 4)
    assert json.loads(seen["headers"]["x-diarist-options"]) == {"prompt": "Quuxwidget Ünïcode", "num_speakers": 2}
    assert seen["headers"]["x-diarist-job-id"] == "job_" + "0" * 32
