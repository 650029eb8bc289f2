"""MOSS-TD hears stereo m4a and multichannel video as the official loader decodes them (issue 33 item 6).

The files are made here (PyAV encodes them; nothing is committed): a stereo AAC ``.m4a`` whose channels
differ, and an ``.mp4`` with a video stream and 5.1 AAC audio. The references are written here from what the
official code does, not from our decoder:

- a non-video file goes through ``librosa.load``; libsndfile cannot read AAC, so librosa falls back to
  audioread, whose FFmpeg hands over 16-bit interleaved samples at the source rate; librosa divides by
  32768, averages the channels and resamples with soxr ``soxr_hq`` to ``ceil(n * 16000 / rate)`` samples;
- a video container goes through PyAV to 16-bit mono 16 kHz (FFmpeg's downmix and resampler).

Stated tolerance: 1e-6 on samples (float rounding only); measured differences are printed (``-s``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from transcription.audio import Frontend, decode_audio

av = pytest.importorskip("av")
soxr = pytest.importorskip("soxr")
torch = pytest.importorskip("torch")

TOLERANCE = 1e-6


def _signal(seconds: float, rate: int, channels: int, seed: int) -> np.ndarray:
    """``[channels, n]`` float32: a different gliding tone plus noise per channel, with silent stretches."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    out = []
    for c in range(channels):
        f = 180 + 60 * c + 80 * np.sin(2 * np.pi * 0.4 * t + c)
        x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / rate) * (np.sin(2 * np.pi * (0.5 + 0.1 * c) * t) > -0.3)
        out.append(x + 0.01 * rng.standard_normal(t.size))
    return np.asarray(out, dtype=np.float32)


def _write(path, signal: np.ndarray, rate: int, layout: str, video: bool) -> None:
    with av.open(str(path), "w") as out:
        if video:
            vs = out.add_stream("mpeg4", rate=5)
            vs.width, vs.height, vs.pix_fmt = 64, 64, "yuv420p"
        a = out.add_stream("aac", rate=rate, layout=layout)
        step = 1024
        for i in range(0, signal.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal[:, i : i + step]), format="fltp",
                                               layout=layout)
            frame.sample_rate, frame.pts = rate, i
            for p in a.encode(frame):
                out.mux(p)
        for p in a.encode(None):
            out.mux(p)
        if video:
            for k in range(int(signal.shape[1] / rate * 5)):
                img = av.VideoFrame.from_ndarray(np.full((64, 64, 3), k * 10 % 255, np.uint8), format="rgb24")
                img.pts = k
                for p in vs.encode(img):
                    out.mux(p)
            for p in vs.encode(None):
                out.mux(p)


def _decoded(path, fmt: str, layout: str | None, rate: int | None) -> tuple[np.ndarray, int]:
    with av.open(str(path)) as c:
        s = c.streams.audio[0]
        r = av.AudioResampler(format=fmt, layout=layout or s.layout, rate=rate or s.codec_context.sample_rate)
        chunks = [o.to_ndarray() for f in c.decode(s) for o in r.resample(f)] + [o.to_ndarray() for o in r.resample(None)]
        return np.concatenate(chunks, axis=1), s.codec_context.sample_rate


def librosa_via_audioread(path) -> np.ndarray:
    """``librosa.load(path, sr=16000)`` where audioread decodes: 16-bit samples, average, soxr_hq."""
    x, rate = _decoded(path, "s16p", None, None)
    y = (x.astype(np.float32) / 32768.0).mean(axis=0)
    n = math.ceil(y.size * 16_000 / rate)
    z = soxr.resample(y, rate, 16_000, quality="soxr_hq")[:n]
    return np.pad(z, (0, n - z.size)).astype(np.float32)


def pyav_s16_mono(path) -> np.ndarray:
    """The official video path: PyAV to 16-bit mono 16 kHz."""
    x, _ = _decoded(path, "s16", "mono", 16_000)
    return (x[0].astype(np.float32) / 32768.0)


def _log_mel_diff(a: np.ndarray, b: np.ndarray) -> float:
    from engine.models.mel import log_mel_spectrogram

    n = min(a.size, b.size, 480_000)
    ma, mb = (log_mel_spectrogram(torch.from_numpy(np.ascontiguousarray(x[:n]))[None])[0] for x in (a, b))
    return float((ma - mb).abs().max())


def _averaged_float(path) -> np.ndarray:
    """The frontend before issue 33: float samples averaged and soxr'd, whatever the container."""
    x, rate = _decoded(path, "fltp", None, None)
    y = x.astype(np.float32).mean(axis=0)
    n = math.ceil(y.size * 16_000 / rate)
    z = soxr.resample(y, rate, 16_000, quality="soxr_hq")[:n]
    return np.pad(z, (0, n - z.size)).astype(np.float32)


def test_stereo_m4a_decodes_to_librosa_loads_samples(tmp_path):
    path = tmp_path / "stereo.m4a"
    _write(path, _signal(6.0, 44_100, 2, 1), 44_100, "stereo", video=False)
    ours = decode_audio(path, frontend=Frontend.LIBROSA)
    official = librosa_via_audioread(path)
    before = _averaged_float(path)
    assert ours.source_channels == 2 and ours.samples.shape == (1, official.size)
    diff = float(np.abs(ours.mono - official).max())
    print(f"stereo m4a: max |ours - official| {diff:.2e}, log-mel {_log_mel_diff(ours.mono, official):.3f}; "
          f"float path (before): log-mel {_log_mel_diff(before, official):.3f}, "
          f"FFmpeg frontend (torchcodec's): log-mel {_log_mel_diff(decode_audio(path).mono, official):.3f}")
    assert diff <= TOLERANCE
    assert float(np.abs(before - official).max()) > TOLERANCE  # the 16-bit rounding is what was missing


def test_multichannel_video_decodes_to_the_official_pyav_samples(tmp_path):
    path = tmp_path / "surround.mp4"
    _write(path, _signal(6.0, 48_000, 6, 2), 48_000, "5.1", video=True)
    ours = decode_audio(path, frontend=Frontend.LIBROSA)
    official = pyav_s16_mono(path)
    before = _averaged_float(path)
    assert ours.source_channels == 6 and ours.samples.shape == (1, official.size)
    diff = float(np.abs(ours.mono - official).max())
    print(f"5.1 video: max |ours - official| {diff:.2e}, log-mel {_log_mel_diff(ours.mono, official):.3f}; "
          f"averaged path (before): log-mel {_log_mel_diff(before, official):.3f}")
    assert diff <= TOLERANCE
    assert _log_mel_diff(before, official) > 0.1  # the averaged mix was far from the official one
    both = decode_audio(path, mono=False, frontend=Frontend.LIBROSA)  # multichannel jobs keep every channel
    assert both.samples.shape[0] == 6
