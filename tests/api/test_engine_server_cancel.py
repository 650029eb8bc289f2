"""A client that goes away ends its engine work: the real engine server (uvicorn on a loopback port) over the
session's tiny.en engine, a three-minute recording, and a client that leaves after the first text.

Each test records how many of the recording's windows the engine finished on its own (the ``finished``
counter; aborted sequences are not counted there): the old server ran every window to the end after the
client had gone, so that count reached the window count. With the fix the abort comes within a step or two
of the disconnect, long before the windows of three minutes of speech could all be decoded.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from diarist.contract.options import TranscribeOptions
from engine_server.client import HttpEngineClient, JobFailure
from tests.conftest import data_file, pcm16_wav
from worker.cancel import CancelToken

pytestmark = pytest.mark.slow

CLIPS = ("en_2spk_phonecall_pyannote_sample/sample.wav", "en_ami_meeting_dev00_2spk/dev00.wav",
         "en_ami_meeting_trn07_4spk/trn07.wav", "multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3",
         "en_ami_meeting_trn05_4spk/trn05.wav")
IDLE_WAIT_S = 15.0
"""Bound on the wait for the engine to drop the request; the abort itself lands within a step or two."""


@pytest.fixture(scope="module")
def long_recording(tmp_path_factory) -> tuple[Path, int]:
    """Distinct clips end to end (distinct, so no window is served from the encoder cache) as 16 kHz
    16-bit WAV, and the number of windows the server's transcriber will cut it into (same decode, VAD and
    packing functions)."""
    from transcription.audio import decode_audio
    from transcription.audio.vad import detect_speech
    from transcription.whisper.windows import pack_windows

    wave_f32 = np.concatenate([decode_audio(data_file(rel)).mono for rel in CLIPS])
    path = tmp_path_factory.mktemp("cancel") / "long.wav"
    path.write_bytes(pcm16_wav(wave_f32))
    n_windows = len(pack_windows(detect_speech(decode_audio(path).mono)))
    assert n_windows >= 5  # three minutes of speech; a cut this coarse would not test much
    return path, n_windows


HANG_S = 10.0
"""Seconds from a cancel to an idle engine beyond which the cancel is taken to have hung; not a speed
figure (an uncanceled three minutes of speech keeps the engine busy far longer)."""


def idle(engine) -> bool:
    s = engine.stats()
    return s["running_requests"] == 0 and s["waiting_requests"] == 0 and s["kv_tokens_used"] == 0


def decoding(engine, decode_tokens0: int) -> bool:
    """Sequences hold KV and decode tokens were made since ``decode_tokens0`` (the windows are past their
    encoder step)."""
    s = engine.stats()
    return s["running_requests"] > 0 and s["decode_tokens"] > decode_tokens0


def wait_idle(engine, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not idle(engine):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def engine_server(whisper_engine):
    """``(engine, url)``: the engine's loop thread and uvicorn on 127.0.0.1, both for this module only."""
    import uvicorn

    from engine_server.server import create_engine_app

    whisper_engine.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_engine_app(whisper_engine, engine_id="cancel-test"),
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="engine-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the engine server did not start"
        time.sleep(0.02)
    yield whisper_engine, url
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
    wait_idle(whisper_engine, 300)  # a failing run leaves work behind; later modules share this engine
    whisper_engine.shutdown()


def start_counts(engine) -> tuple[int, int]:
    assert wait_idle(engine, 60), f"the engine was busy before the test: {engine.stats()}"
    return engine.allocator.num_free, engine.counters["finished"]


def assert_request_dropped(engine, free0: int, finished0: int, n_windows: int) -> None:
    assert wait_idle(engine, IDLE_WAIT_S), f"engine still busy {IDLE_WAIT_S} s after the client left: {engine.stats()}"
    assert engine.allocator.num_free == free0
    assert engine.counters["finished"] - finished0 < n_windows  # some windows were aborted, not run out


def test_disconnect_mid_stream_aborts_the_engine_sequences(engine_server, long_recording):
    engine, url = engine_server
    path, n_windows = long_recording
    free0, finished0 = start_counts(engine)
    seen = []
    with httpx.Client(timeout=120) as c, c.stream("POST", f"{url}/internal/transcribe", content=path.read_bytes(),
                                                  params={"options": json.dumps({"num_speakers": 2})}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                seen.append(json.loads(line)["type"])
            if "started" in seen:  # the first text: sequences are admitted and hold KV
                busy = engine.stats()
                break
    # leaving both blocks closed the connection with the stream half read
    assert seen[:2] == ["stage", "queued"] and "result" not in seen  # decode, then the duration
    assert busy["kv_tokens_used"] > 0 and busy["running_requests"] > 0
    assert_request_dropped(engine, free0, finished0, n_windows)


def test_worker_client_closes_the_stream_when_the_job_is_canceled(engine_server, long_recording):
    engine, url = engine_server
    path, n_windows = long_recording
    free0, finished0 = start_counts(engine)
    token = CancelToken()

    def on_event(kind: str, payload: dict) -> None:  # the worker's progress callback cancels on a stale row
        if kind == "started":
            token.cancel()

    with pytest.raises(JobFailure) as e:
        HttpEngineClient(url, timeout_s=120).transcribe(path, TranscribeOptions(num_speakers=2), on_event=on_event, cancel=token)
    assert e.value.code == "canceled" and not e.value.retryable
    assert_request_dropped(engine, free0, finished0, n_windows)


def test_a_cancel_from_another_thread_unblocks_a_silent_stream(engine_server, long_recording):
    """No event reaches the client (``on_event`` is None and the read blocks): a token set by another thread
    (the worker's cancel watch) shuts the socket down, the blocked read returns, and the engine drops the
    request's sequences within a second or two. The cancel comes once the windows decode (an abort lands
    between engine steps, and one CPU encoder step over a batch of windows alone can take seconds)."""
    engine, url = engine_server
    path, n_windows = long_recording
    free0, finished0 = start_counts(engine)
    token = CancelToken()
    marks: dict[str, float] = {}
    decode0 = engine.counters["decode_tokens"]

    def cancel_once_busy() -> None:
        deadline = time.monotonic() + 60
        while not decoding(engine, decode0) and time.monotonic() < deadline:
            time.sleep(0.01)
        marks["cancel"] = time.monotonic()
        token.cancel()
        while not idle(engine) and time.monotonic() < deadline:
            time.sleep(0.01)
        marks["idle"] = time.monotonic()

    watcher = threading.Thread(target=cancel_once_busy, daemon=True)
    watcher.start()
    with pytest.raises(JobFailure) as e:
        HttpEngineClient(url, timeout_s=120).transcribe(path, TranscribeOptions(num_speakers=2), cancel=token)
    watcher.join(timeout=70)
    assert e.value.code == "canceled" and not e.value.retryable
    # assert_request_dropped proves the cancel (windows aborted, not run out); this bounds a hang, loosely
    # enough for a loaded 2-core machine (one CPU step over a batch of windows can take seconds there)
    assert marks["idle"] - marks["cancel"] < HANG_S, marks
    assert_request_dropped(engine, free0, finished0, n_windows)


def test_disconnect_during_a_synchronous_openai_request_aborts_it(engine_server, long_recording):
    """No response is written while the synchronous route waits, so only the ASGI disconnect can tell."""
    engine, url = engine_server
    path, n_windows = long_recording
    free0, finished0 = start_counts(engine)
    req = httpx.Request("POST", f"{url}/v1/audio/transcriptions", data={"model": "whisper"},
                        files={"file": ("long.wav", path.read_bytes(), "audio/wav")})
    head = f"POST {req.url.raw_path.decode()} HTTP/1.1\r\nHost: {req.url.netloc.decode()}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in req.headers.items() if k.lower() != "host") + "\r\n"
    with socket.create_connection((req.url.host, req.url.port)) as s:
        s.sendall(head.encode() + req.read())
        deadline = time.monotonic() + 60
        while engine.stats()["kv_tokens_used"] == 0:  # wait until the request's windows hold KV
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.02)
    assert_request_dropped(engine, free0, finished0, n_windows)


class Records(logging.Handler):
    """The engine server's log records, as its handler would get them."""

    def __init__(self) -> None:
        from diarist.logs import ContextFilter

        super().__init__(logging.INFO)
        self.addFilter(ContextFilter())  # sets record.job_id, as the service's handler does
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_worker_cancel_only_lowers_the_engine_load_and_is_logged(engine_server, long_recording):
    """Issue 33 item 12 end to end: from the worker's cancel on, the engine's running + waiting count never
    rises and reaches zero (sampled every 5 ms); issue 33 item 16: the engine server logs the request's line
    (job id, audio seconds, tokens, finish reason ``abort``, seconds) and one cancel line."""
    from diarist.logs import job_context

    engine, url = engine_server
    path, n_windows = long_recording
    free0, finished0 = start_counts(engine)
    token = CancelToken()
    samples: list[tuple[bool, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            s = engine.stats()
            samples.append((token.is_set(), s["running_requests"] + s["waiting_requests"]))
            time.sleep(0.005)

    def on_event(kind: str, payload: dict) -> None:
        if kind == "started":
            token.cancel()

    logger, records = logging.getLogger("diarist.engine_server"), Records()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with job_context("job_" + "c" * 32), pytest.raises(JobFailure):
            HttpEngineClient(url, timeout_s=120).transcribe(path, TranscribeOptions(num_speakers=2), on_event=on_event,
                                                            cancel=token)
        assert_request_dropped(engine, free0, finished0, n_windows)
        deadline = time.monotonic() + 10
        while not any(getattr(r, "fields", {}).get("event") == "cancel" for r in records.records):
            assert time.monotonic() < deadline, "no cancel line"
            time.sleep(0.05)
    finally:
        stop.set()
        sampler.join()
        logger.removeHandler(records)
        logger.setLevel(level)
    s = engine.stats()  # one sample after the sampler stopped: a starved sampler thread may have missed the zero
    samples.append((True, s["running_requests"] + s["waiting_requests"]))
    after = [n for canceled, n in samples if canceled]
    assert after and after[-1] == 0
    runs = [(n, len(list(g))) for n, g in itertools.groupby(after)]  # (load, samples): short enough to print
    assert all(b <= a for a, b in itertools.pairwise(after)), f"the load rose after the cancel: {runs}"
    mine = [r for r in records.records if getattr(r, "fields", None)]
    done = [r for r in mine if "finish_reason" in r.fields]
    cancels = [r for r in mine if r.fields.get("event") == "cancel"]
    assert len(done) == 1 and len(cancels) == 1
    f = done[0].fields
    assert f["finish_reason"] == "abort" and f["audio_s"] == pytest.approx(len(path.read_bytes()) / 32_000, abs=0.1)
    assert f["seconds"] > 0 and f["output_tokens"] is not None and done[0].job_id == "job_" + "c" * 32
    assert cancels[0].fields["request_id"] == f["request_id"]
