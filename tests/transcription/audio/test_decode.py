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


# libswresample's default downmix to mono (rematrix.c swr_build_matrix: centre_mix_level and
# surround_mix_level -3 dB, lfe_mix_level 0; fronts folded into the centre at 1/sqrt(2), surrounds at
# 1/sqrt(2) * 1/sqrt(2)), in the channel order of FFmpeg's 5.1 and 7.1 layouts
FFMPEG_MONO = {"5.1": [0.7071, 0.7071, 1.0, 0.0, 0.5, 0.5], "7.1": [0.7071, 0.7071, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5]}


def _mix_weights(mono: np.ndarray, channels: np.ndarray) -> np.ndarray:
    """Least-squares weights of each channel in the downmix (``[1, n]`` from ``[c, n]``)."""
    return np.linalg.lstsq(channels.T.astype(np.float64), mono[0].astype(np.float64), rcond=None)[0]


def _surround(path, layout: str, codec: str, rate: int = 48_000, seconds: float = 1.0) -> np.ndarray:
    """Independent noise on each channel of ``layout`` written with ``codec`` (PyAV); returns the samples."""
    import av

    n = av.AudioLayout(layout).nb_channels
    x = (0.05 * np.random.default_rng(n).standard_normal((n, int(rate * seconds)))).astype(np.float32)
    with av.open(str(path), "w") as c:
        st = c.add_stream(codec, rate=rate, layout=layout)
        size = st.codec_context.frame_size or 1024
        for i in range(0, x.shape[1] - size + 1, size):
            fr = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i : i + size].T).reshape(1, -1),
                                            format="flt", layout=layout)
            fr.sample_rate, fr.pts = rate, i
            for p in st.encode(fr):
                c.mux(p)
        for p in st.encode(None):
            c.mux(p)
    return x


def test_a_7_1_aac_file_decodes_without_crashing_the_process(tmp_path):
    """AAC decodes to planar float, and PyAV 18 reads one plane past a planar frame of 8 channels: the API's
    duration probe and the decoder died with a segmentation fault on any 7.1 AAC upload."""
    import subprocess
    import sys

    path = tmp_path / "surround71.m4a"
    _surround(path, "7.1", "aac")
    code = (f"from pathlib import Path; from api.intake import measure_duration; "
            f"from transcription.audio.decode import decode_audio; p = {str(path)!r}; "
            f"print(round(measure_duration(Path(p)), 2), decode_audio(p).samples.shape, "
            f"decode_audio(p, mono=False).samples.shape)")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "(1, " in r.stdout and "(8, " in r.stdout


@pytest.mark.parametrize("layout", ["5.1", "7.1"])
def test_surround_downmixes_with_ffmpeg_s_default_weights(tmp_path, layout):
    """Centre and fronts weighted, LFE left out, as ``ffmpeg -ac 1`` does; also for a WAV that gives only a
    channel count (no channel mask: FFmpeg guesses the layout from the count), and for samples a caller
    decoded with every channel (:func:`downmix`, the transcriber's path)."""
    import wave

    # 7.1 as PCM in a WAV with its channel mask (its AAC decode is the crash test's, in a subprocess)
    path = tmp_path / ("s.m4a" if layout == "5.1" else "s.wav")
    _surround(path, layout, "aac" if layout == "5.1" else "pcm_s16le")
    mono, every = dec.decode_audio(path), dec.decode_audio(path, mono=False)
    np.testing.assert_allclose(_mix_weights(mono.samples, every.samples), FFMPEG_MONO[layout], atol=2e-3)
    np.testing.assert_allclose(dec.downmix(every.samples), mono.samples, atol=1e-4)

    n = len(FFMPEG_MONO[layout])
    pcm = (np.random.default_rng(1).standard_normal((48_000, n)) * 3000).astype("<i2")
    with wave.open(str(tmp_path / "bare.wav"), "wb") as w:  # WAVE_FORMAT_PCM: no channel mask
        w.setnchannels(n)
        w.setsampwidth(2)
        w.setframerate(48_000)
        w.writeframes(pcm.tobytes())
    mono, every = dec.decode_audio(tmp_path / "bare.wav"), dec.decode_audio(tmp_path / "bare.wav", mono=False)
    np.testing.assert_allclose(_mix_weights(mono.samples, every.samples), FFMPEG_MONO[layout], atol=2e-3)


def _damaged_mp3(tmp_path, at: float = 0.45, size: int = 3000):
    """The shared 59.9 s MP3 with ``size`` random bytes (seeded) written over it at ``at`` of its length."""
    from tests.conftest import data_file

    raw = bytearray(data_file("multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3").read_bytes())
    off = int(at * len(raw))
    raw[off : off + size] = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "damaged.mp3"
    path.write_bytes(bytes(raw))
    return path


def test_a_file_damaged_in_the_middle_is_decoded_past_the_damage_and_the_loss_counted(tmp_path):
    """As ``ffmpeg`` does, decoding resynchronises after a damaged stretch instead of stopping there (it
    stopped at 26.9 s of 59.9), and the result's warnings say what was skipped; the API's duration probe
    reads the file the same way, and the count crosses the worker-to-engine wire."""
    from pathlib import Path

    from api.intake import measure_duration
    from diarist.pcm import DAMAGED_CODE, PcmFormat

    path = _damaged_mp3(tmp_path)
    audio = dec.decode_audio(path)
    assert audio.duration > 58.0  # 3,000 bytes of a 4 kB/s stream: under a second lost
    assert audio.damaged >= 1 and 0.0 < audio.damaged_s < 2.0
    (w,) = audio.warnings
    assert w["code"] == DAMAGED_CODE and w["count"] == audio.damaged and "skipped" in w["message"]
    # the API's intake reads the header's duration (the whole file, damage included), never a file cut at the
    # damage; the worker's decode gives the exact length
    assert audio.duration - 0.05 < measure_duration(Path(path)) <= audio.duration + audio.damaged_s + 0.05
    fmt = PcmFormat.from_header(audio.pcm_format().to_header())
    back = dec.DecodedAudio.from_pcm(fmt, b"".join(audio.pcm_chunks()))
    assert (back.damaged, back.damaged_s) == (audio.damaged, audio.damaged_s) and back.warnings == audio.warnings


def test_a_clean_file_has_no_damage_warning():
    from tests.conftest import data_file

    audio = dec.decode_audio(data_file("multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3"))
    assert audio.damaged == 0 and audio.warnings == [] and audio.duration == pytest.approx(59.9, abs=0.05)
