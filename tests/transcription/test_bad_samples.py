"""NaN/inf samples in a float WAV are replaced and counted, or refused; never read as silence (issue 21, 9)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from diarist.pcm import MAX_NONFINITE_FRACTION
from diarist.transcript import Transcript
from tests.conftest import data_file
from transcription.audio import AudioError, decode_audio

SPEECH = "en_librispeech_1272-128104-0000_picovoice/test.wav"  # 5.9 s of clear read speech, 16 kHz int16
BAD = {1000: np.nan, 20_000: np.inf, 40_000: -np.inf, 60_001: np.nan, 80_000: np.nan}


def float_wav(path: Path, samples: np.ndarray, rate: int = 16_000) -> Path:
    """A mono IEEE-float WAV (format tag 3, 32 bit) holding ``samples`` exactly, NaN and inf included."""
    data = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


@pytest.fixture(scope="module")
def clean() -> np.ndarray:
    return decode_audio(data_file(SPEECH)).samples[0]


def with_bad(clean: np.ndarray, positions: dict) -> np.ndarray:
    x = clean.copy()
    for i, v in positions.items():
        x[i] = v
    return x


def test_a_few_nan_and_inf_values_are_replaced_and_counted(clean, tmp_path):
    wav = float_wav(tmp_path / "bad.wav", with_bad(clean, BAD))
    audio = decode_audio(wav)
    assert audio.codec == "pcm_f32le" and audio.samples.shape == (1, clean.size)
    assert np.isfinite(audio.samples).all()
    assert audio.nonfinite == len(BAD) and audio.source_values == clean.size
    # every other sample is the file's own (16 kHz in, no resampling); the bad ones are silence
    keep = np.ones(clean.size, bool)
    keep[list(BAD)] = False
    assert np.array_equal(audio.samples[0][keep], clean[keep])
    assert (audio.samples[0][list(BAD)] == 0).all()
    (w,) = audio.warnings
    assert w["code"] == "invalid_samples" and w["count"] == 5 and f"of the {clean.size}" in w["message"]


def test_bad_values_are_not_smeared_by_resampling(clean, tmp_path):
    # at 22.05 kHz the resampler's filter would spread one NaN over its neighbours (and the window)
    rate = 22_050
    up = np.interp(np.arange(int(clean.size * rate / 16_000)) * 16_000 / rate, np.arange(clean.size), clean)
    audio = decode_audio(float_wav(tmp_path / "bad22k.wav", with_bad(up.astype(np.float32), BAD), rate))
    assert np.isfinite(audio.samples).all() and audio.nonfinite == len(BAD)
    assert np.abs(audio.samples).max() > 0.05  # the speech is still there


def test_too_many_bad_values_are_refused(clean, tmp_path):
    n = int(clean.size * MAX_NONFINITE_FRACTION) + 1
    wav = float_wav(tmp_path / "broken.wav", with_bad(clean, dict.fromkeys(range(0, 2 * n, 2), np.nan)))
    with pytest.raises(AudioError) as e:
        decode_audio(wav)
    assert e.value.code == "invalid_samples" and f"{n} of the {clean.size}" in e.value.message


def test_intake_refuses_too_many_and_measures_a_few(clean, tmp_path):
    from api.intake import measure_duration
    from diarist.http.errors import ApiError

    assert measure_duration(float_wav(tmp_path / "few.wav", with_bad(clean, BAD))) == pytest.approx(5.855, abs=1e-3)
    many = dict.fromkeys(range(0, clean.size, 50), np.inf)  # 2%
    with pytest.raises(ApiError) as e:
        measure_duration(float_wav(tmp_path / "many.wav", with_bad(clean, many)))
    assert (e.value.status, e.value.code) == (422, "invalid_samples")


@pytest.mark.slow
def test_speech_with_nan_samples_is_transcribed_not_read_as_silence(whisper_engine, clean, tmp_path):
    from transcription.transcriber import TranscribeOptions, Transcriber

    tr = Transcriber(whisper_engine)
    opts = TranscribeOptions(diarize=False)
    ref = tr.transcribe(str(float_wav(tmp_path / "clean.wav", clean)), opts)
    r = tr.transcribe(str(float_wav(tmp_path / "bad.wav", with_bad(clean, BAD))), opts)
    t = Transcript.from_engine(r)
    assert not t.no_speech and "quilter" in t.text.lower() and "apostle" in t.text.lower()
    assert t.text == Transcript.from_engine(ref).text  # five zeroed samples change nothing audible
    assert [(w.code, w.count) for w in t.warnings] == [("invalid_samples", 5)]
    assert ref.warnings == []


def test_the_count_crosses_the_worker_to_engine_wire(clean, tmp_path):
    """Workers decode and send PCM: the replaced values travel in the PCM header to the engine's result."""
    from diarist.pcm import PcmFormat
    from transcription.audio import DecodedAudio

    audio = decode_audio(float_wav(tmp_path / "bad.wav", with_bad(clean, BAD)))
    fmt = PcmFormat.from_header(audio.pcm_format().to_header())
    back = DecodedAudio.from_pcm(fmt, b"".join(audio.pcm_chunks()))
    assert back.warnings == audio.warnings and back.nonfinite == len(BAD)
    with pytest.raises(ValueError, match="nonfinite"):
        PcmFormat.from_header(fmt.to_header().replace('"nonfinite": 5', '"nonfinite": -1'))
