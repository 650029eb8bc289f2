"""The WAV fast path of ``decode_audio`` gives PyAV's samples exactly; everything else still goes through PyAV."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests.conftest import pcm16_wav, wav_bytes
from transcription.audio import decode as dec


def _pyav(path, monkeypatch) -> dec.DecodedAudio:
    with monkeypatch.context() as m:
        m.setattr(dec, "_pcm16_wav", lambda source: None)
        return dec.decode_audio(path)


def test_16k_mono_pcm_wav_is_read_without_ffmpeg_and_equals_pyav(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.integers(-32768, 32768, 48_001), [-32768, 32767, 0]])
    f = tmp_path / "a.wav"
    f.write_bytes(pcm16_wav(x))
    fast = dec._pcm16_wav(f)
    assert fast is not None
    ref = _pyav(f, monkeypatch)
    assert fast.samples.dtype == np.float32 and fast.samples.shape == ref.samples.shape == (1, x.size)
    assert np.array_equal(fast.samples, ref.samples)
    assert (fast.codec, fast.container, fast.source_sample_rate, fast.source_channels) == (
        ref.codec, ref.container, ref.source_sample_rate, ref.source_channels)
    assert np.array_equal(dec.decode_audio(f).samples, ref.samples)


@pytest.mark.parametrize("rate, channels", [(44_100, 1), (16_000, 2), (8_000, 1)])
def test_other_wavs_go_through_pyav(tmp_path, rate, channels):
    f = tmp_path / "b.wav"
    f.write_bytes(pcm16_wav(np.zeros(rate * channels // 10, np.int16), rate, channels))
    assert dec._pcm16_wav(f) is None
    out = dec.decode_audio(f)
    assert out.samples.shape == (1, 1600) and out.source_sample_rate == rate and out.source_channels == channels


def test_bytes_and_broken_files_take_the_pyav_path_and_its_error_codes(tmp_path):
    no_frames = wav_bytes(0.0)
    assert dec._pcm16_wav(no_frames) is None  # not a path: PyAV
    empty = tmp_path / "empty.wav"
    empty.write_bytes(no_frames)
    with pytest.raises(dec.AudioError) as e:
        dec.decode_audio(empty)
    assert e.value.code == "empty_audio"
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF\x00\x00")
    with pytest.raises(dec.AudioError) as e:
        dec.decode_audio(junk)
    assert e.value.code == "decode_failed"


@pytest.mark.parametrize("as_str", [False, True])
def test_a_zero_byte_input_is_empty_audio_and_no_message_names_the_file(tmp_path, as_str):
    """Zero bytes is ``empty_audio`` (the API's intake code), not an FFmpeg open failure; FFmpeg's messages
    are given without the file name it appends (a server's temporary path must not reach a client)."""
    zero = tmp_path / "upload-zero"
    zero.write_bytes(b"")
    for source in (str(zero) if as_str else zero, b"", io.BytesIO(b"")):
        with pytest.raises(dec.AudioError) as e:
            dec.decode_audio(source)
        assert (e.value.code, e.value.message) == ("empty_audio", "the file is empty")
    junk = tmp_path / "upload-junk"
    junk.write_bytes(b"just some text\n" * 10)
    with pytest.raises(dec.AudioError) as e:
        dec.decode_audio(str(junk) if as_str else junk)
    assert e.value.code == "decode_failed" and str(tmp_path) not in e.value.message and "upload-" not in e.value.message
