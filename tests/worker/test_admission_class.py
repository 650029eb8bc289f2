"""The job's duration class reaches every engine ``Sequence`` it makes (``Sequence.admission_class``), over
the in-process client (embedded mode) and over the engine server's HTTP stream (production), for MOSS-TD
(one sequence per recording) and Whisper (one per window); the server refuses an unknown class."""

from __future__ import annotations

import io
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from diarist.contract.options import TranscribeOptions
from diarist.contract.result import TranscriptionResult
from engine_server.client import HttpEngineClient, InProcessEngineClient
from tests.conftest import data_file, pcm16_wav
from worker import routing

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_admission_class_of_each_queue():
    assert routing.admission_class(routing.SHORT) == "short"
    assert routing.admission_class(routing.LONG) == "long"
    assert routing.admission_class(routing.WEBHOOKS) == "default"
    assert routing.admission_class("no.such.queue") == "default"


class Recorder:
    """Wraps ``engine.submit``: records the admission class of every sequence submitted."""

    def __init__(self, engine) -> None:
        self.engine, self.classes, self._submit = engine, [], engine.submit
        engine.submit = self

    def __call__(self, seq) -> None:
        self.classes.append(seq.admission_class)
        self._submit(seq)

    def take(self) -> list[str]:
        out, self.classes = self.classes, []
        return out

    def restore(self) -> None:
        self.engine.submit = self._submit


@pytest.fixture(scope="module")
def moss():
    """A tiny dummy MOSS-TD engine with its loop running, its ``submit`` recorded."""
    from tests.conftest import tiny_moss_engine

    engine = tiny_moss_engine()
    engine.start()
    rec = Recorder(engine)
    yield engine, rec
    rec.restore()
    engine.shutdown()


@pytest.fixture(scope="module")
def noise_wav(tmp_path_factory) -> Path:
    """Two seconds of 16 kHz 16-bit noise."""
    path = tmp_path_factory.mktemp("adm") / "noise.wav"
    from tests.conftest import noise_wav as noise

    path.write_bytes(noise(2.0, seed=0, std=3000))
    return path


def serve(app) -> tuple[str, object, threading.Thread]:
    """``app`` under uvicorn on a free loopback port: ``(url, server, thread)``."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


@pytest.fixture(scope="module")
def moss_server(moss):
    from engine_server.server import create_engine_app

    # A short fixed output (the benchmark switch, dummy weights): what is under test is the admission class
    url, server, thread = serve(create_engine_app(moss[0], engine_id="adm", fixed_output_tokens=4))
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("klass", ["short", "long"])
def test_in_process_client_sets_the_class(moss, noise_wav, klass):
    from transcription.transcriber import Transcriber

    engine, rec = moss
    rec.take()
    client = InProcessEngineClient(Transcriber(engine, fixed_output_tokens=4))
    result = client.transcribe(noise_wav, TranscribeOptions(admission_class=klass))
    assert result.metrics.prompt_tokens > 0
    assert rec.take() == [klass]


@pytest.mark.parametrize("klass", ["short", "long"])
def test_http_client_sets_the_class(moss, moss_server, noise_wav, klass):
    _engine, rec = moss
    rec.take()
    result = HttpEngineClient(moss_server, timeout_s=60).transcribe(noise_wav, TranscribeOptions(admission_class=klass))
    assert result.engine_id == "adm"
    assert rec.take() == [klass]


def test_http_default_when_the_client_sends_none(moss, moss_server, noise_wav):
    import httpx

    _engine, rec = moss
    rec.take()
    with httpx.stream("POST", f"{moss_server}/internal/transcribe", content=noise_wav.read_bytes(), timeout=60) as r:
        lines = list(r.iter_lines())
    assert r.status_code == 200 and '"result"' in lines[-1]
    assert rec.take() == ["default"]


def test_server_refuses_an_unknown_class(moss, moss_server, noise_wav):
    import httpx

    _engine, rec = moss
    rec.take()
    from engine_server.protocol import ADMISSION_CLASS_HEADER

    r = httpx.post(f"{moss_server}/internal/transcribe", headers={ADMISSION_CLASS_HEADER: "urgent"},
                   content=noise_wav.read_bytes(), timeout=60)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and "urgent" in err["message"] and "short" in err["message"]
    assert rec.take() == []  # nothing reached the engine


@pytest.mark.slow
def test_every_whisper_window_gets_the_class(whisper_engine, tmp_path):
    """A Whisper job is one sequence per window: each of them carries the class."""
    from transcription.audio import decode_audio
    from transcription.transcriber import Transcriber

    speech = decode_audio(data_file("en_jfk_inaugural/jfk.flac")).mono  # 11 s
    long = tmp_path / "long.wav"  # 4 x (11 s of speech + 1 s of silence): more than one 30 s window
    long.write_bytes(pcm16_wav(np.concatenate([speech, np.zeros(16_000, dtype=np.float32)] * 4)))
    rec = Recorder(whisper_engine)
    try:
        client = InProcessEngineClient(Transcriber(whisper_engine))
        result = client.transcribe(long, TranscribeOptions(num_speakers=1, admission_class="long"))
        classes = rec.take()
        assert result.pipeline_metrics["decode_attempts"] == len(classes) >= result.pipeline_metrics["windows"] >= 2
        assert set(classes) == {"long"}
    finally:
        rec.restore()


def test_process_job_sends_the_class_of_the_job_queue(services, make_job):
    """The worker derives the class from the job row's queue and hands it to the engine client."""
    from diarist.models import JobMetrics
    from worker.celery_app import CeleryDispatcher
    from worker.process import process_job
    from worker.runtime import Runtime

    seen: list[str] = []

    class Engine:
        engine_id = "fake"

        def transcribe(self, audio, options, on_event=None, cancel=None):
            seen.append(options.admission_class)
            return TranscriptionResult(duration=1.0, segments=[], finish_reason="stop", no_speech=True)

    rt = Runtime(services=services, engine=Engine(), dispatcher=CeleryDispatcher(services.settings))
    for queue in (routing.SHORT, routing.LONG):
        services.store.put_file(f"jobs/{queue}/audio", io.BytesIO(b"RIFF...."))
        job_id = make_job(audio_key=f"jobs/{queue}/audio", queue=queue)
        assert process_job(rt, job_id).state == "completed"
        with services.db.session() as s:
            extra = s.get(JobMetrics, job_id).extra
        # where the worker's time went is stored beside the engine's metrics
        assert {"worker_fetch_s", "worker_engine_s", "worker_store_s"} <= set(extra)
        assert all(extra[k] >= 0 for k in ("worker_fetch_s", "worker_engine_s", "worker_store_s"))
    assert seen == ["short", "long"]
