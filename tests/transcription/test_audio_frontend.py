"""Each model family hears a file as its official loader decodes it (transcription.audio.Frontend).

MOSS-TD's official code reads audio with ``transformers.audio_utils.load_audio`` (soundfile + soxr, the same
steps as ``librosa.load``): channels averaged, ``soxr_hq`` to 16 kHz. Our ``librosa`` frontend gives its
samples exactly on these files (stated tolerance: 1e-6 absolute; measured 0). FFmpeg's downmix, which the
Whisper family keeps, is (L+R)/sqrt(2): 3 dB louder on correlated stereo.
"""

from __future__ import annotations

import numpy as np
import pytest

from diarist.contract.options import TranscribeOptions
from tests.conftest import data_file
from transcription.audio import Frontend, decode_audio

transformers = pytest.importorskip("transformers")
STEREO_44K = "en_timit_LDC93S1_16k_8k_44k-stereo/LDC93S1_pcms16le_2_44100.wav"


@pytest.mark.parametrize("name", [STEREO_44K, "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav",
                                  "en_timit_LDC93S1_16k_8k_44k-stereo/LDC93S1_pcms16le_1_8000.wav"])
def test_librosa_frontend_gives_the_official_loaders_samples(name):
    from transformers.audio_utils import load_audio

    path = data_file(name)
    ours = decode_audio(path, frontend=Frontend.LIBROSA)
    official = load_audio(str(path), sampling_rate=16_000, backend="soundfile")
    assert ours.samples.shape == (1, official.shape[0]) and ours.mono.dtype == np.float32
    assert float(np.abs(ours.mono - official).max()) <= 1e-6


def test_stereo_44k_channels_are_averaged_not_ffmpeg_mixed():
    path = data_file(STEREO_44K)
    ours = decode_audio(path, frontend=Frontend.LIBROSA)
    both = decode_audio(path, mono=False, frontend=Frontend.LIBROSA)
    assert ours.source_channels == 2 and ours.source_sample_rate == 44_100 and both.samples.shape[0] == 2
    np.testing.assert_allclose(ours.mono, both.samples.mean(axis=0), atol=1e-6)  # mean, then resample
    ffmpeg = decode_audio(path)  # the whisper family's frontend
    ratio = np.sqrt((ffmpeg.mono ** 2).mean() / (ours.mono ** 2).mean())
    assert ratio == pytest.approx(np.sqrt(2), rel=1e-3)  # FFmpeg's (L+R)/sqrt(2) on this dual-mono file


def test_the_moss_transcriber_uses_the_official_frontend():
    from engine import Engine, EngineConfig
    from engine.loaders.moss_td import TINY_DUMMY_CONFIG
    from transcription.transcriber import Transcriber

    eng = Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY_DUMMY_CONFIG,
                              kv_budget_bytes=4 << 20, max_running_requests=2))
    assert Transcriber(eng).frontend is Frontend.LIBROSA


def test_workers_decode_as_the_engines_family(monkeypatch, tmp_path):
    """A worker decodes uploads for its engine server (engine_server/client.py) with the frontend of the family
    the engine says it serves (``GET /info``), whatever the worker's own DIARIST_MODEL says."""
    from engine.config import FAMILIES
    from engine_server.client import HttpEngineClient, JobFailure
    from transcription.audio import AudioError, decode
    from worker.engine_pool import engine_client

    assert Frontend.for_family("whisper") is Frontend.FFMPEG and Frontend.for_family("moss-td") is Frontend.LIBROSA
    seen = []

    def fake(source, mono=True, frontend=Frontend.FFMPEG):
        seen.append(frontend)
        raise AudioError("decode_failed", "stop here")

    monkeypatch.setattr(decode, "decode_audio", fake)
    for served in ("moss-td", "whisper"):
        monkeypatch.setattr(HttpEngineClient, "info",
                            lambda self, f=served: {"family": f, "frontend": FAMILIES[f].frontend})
        with pytest.raises(JobFailure):
            engine_client(["http://127.0.0.1:9"], timeout_s=1, expected_family="whisper").transcribe(
                tmp_path / "a.wav", TranscribeOptions())
    assert seen == [Frontend.LIBROSA, Frontend.FFMPEG]
