"""A worker decodes for the model family its engine serves, as the engine says (``GET /info``), not as its own
``DIARIST_MODEL`` says; random weights show on the OpenAI-compatible route too (issue 33 item 5)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from diarist.contract.options import TranscribeOptions
from tests.conftest import pcm16_wav
from tests.worker.test_admission_class import serve

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def moss_url():
    """An engine server on a tiny dummy MOSS-TD (random weights, the ``librosa`` frontend)."""
    from engine_server.server import create_engine_app
    from tests.conftest import tiny_moss_engine

    engine = tiny_moss_engine()
    engine.start()
    url, server, thread = serve(create_engine_app(engine, engine_id="fam", fixed_output_tokens=4))
    yield url
    server.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


@pytest.fixture(scope="module")
def stereo_wav(tmp_path_factory):
    """Two seconds of 44.1 kHz stereo: the channels differ, so the two frontends' mixes differ (3 dB)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((88_200, 2)) * 3000).astype("<i2")
    path = tmp_path_factory.mktemp("fam") / "stereo.wav"
    path.write_bytes(pcm16_wav(x.reshape(-1), rate=44_100, channels=2))
    return path


def test_the_engine_says_what_it_serves(moss_url):
    import httpx

    info = httpx.get(f"{moss_url}/info").json()
    assert info == {"engine_id": "fam", "family": "moss-td", "frontend": "librosa", "model": "moss-td-dummy",
                    "random_weights": True}


def test_a_worker_configured_for_whisper_decodes_for_the_moss_engine(moss_url, stereo_wav, monkeypatch, caplog):
    from transcription import audio
    from transcription.audio import Frontend
    from worker.engine_pool import engine_client

    used = []
    real = audio.decode_audio

    def spy(*args, **kwargs):
        used.append(kwargs["frontend"])
        return real(*args, **kwargs)

    monkeypatch.setattr(audio, "decode_audio", spy)
    client = engine_client([moss_url], timeout_s=60, expected_family="whisper")  # DIARIST_MODEL=whisper
    with caplog.at_level(logging.WARNING, logger="diarist.worker"):
        result = client.transcribe(stereo_wav, TranscribeOptions())
        client.transcribe(stereo_wav, TranscribeOptions())
    assert used == [Frontend.LIBROSA, Frontend.LIBROSA]  # the engine's frontend, not DIARIST_MODEL's
    assert result.engine_id == "fam" and result.random_weights
    warned = [r.getMessage() for r in caplog.records if "DIARIST_MODEL=whisper" in r.getMessage()]
    assert len(warned) == 1 and "serves moss-td" in warned[0]  # once, not per job


def test_samples_decoded_for_another_family_are_refused(moss_url, stereo_wav):
    """A client that decoded with FFmpeg's downmix (stereo 1.41x louder than the average MOSS-TD hears) is
    refused before the engine runs anything; the worker's next attempt asks ``/info`` again."""
    import httpx

    from diarist.contract.options import TranscribeOptions
    from engine_server.client import _http_failure
    from engine_server.protocol import request_headers
    from transcription.audio import Frontend, decode_audio

    decoded = decode_audio(stereo_wav, frontend=Frontend.FFMPEG)
    fmt = decoded.pcm_format()
    for frontend, status in (("ffmpeg", 409), ("librosa", 200)):
        from dataclasses import replace

        headers = request_headers(TranscribeOptions(), replace(fmt, frontend=frontend))
        r = httpx.post(f"{moss_url}/internal/transcribe", content=b"".join(decoded.pcm_chunks()), headers=headers,
                       timeout=60)
        assert r.status_code == status, r.text
    r = httpx.post(f"{moss_url}/internal/transcribe", content=b"".join(decoded.pcm_chunks()),
                   headers=request_headers(TranscribeOptions(), replace(fmt, frontend="ffmpeg")), timeout=60)
    failure = _http_failure(r)
    assert failure.code == "frontend_mismatch" and failure.retryable and "librosa" in failure.message


def test_random_weights_show_on_the_openai_route(moss_url, stereo_wav):
    import httpx

    for fmt in ("json", "verbose_json", "diarized_json", "text"):
        r = httpx.post(f"{moss_url}/v1/audio/transcriptions", files={"file": ("a.wav", stereo_wav.read_bytes())},
                       data={"model": "moss-td", "response_format": fmt}, timeout=60)
        assert r.status_code == 200 and r.headers["x-diarist-random-weights"] == "true", fmt
        if fmt != "text":
            body = json.loads(r.text)
            assert body["random_weights"] is True and body["warnings"][0]["code"] == "random_weights", fmt
