"""Decode any container FFmpeg reads (through PyAV) to 16 kHz float32 PCM, and the one home of the refusals
of a bad file (:func:`open_media`, :func:`first_audio_stream`, :func:`undecodable`, :func:`no_samples`),
which the API's intake raises too: the CLI, the engine server and the API say the same for the same file.
Torch-free (the API imports it).

How channels are mixed and the rate converted is the model family's own loader (:class:`Frontend`): a model
hears what it was trained and evaluated on, and MOSS-TD's official loader differs from FFmpeg's defaults.
"""

from __future__ import annotations

import io
import math
import os
import wave
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np

from diarist.pcm import FLOAT_SAMPLE_FORMATS, InvalidSamples, check_nonfinite, replace_nonfinite
from engine.models.audio_input import SAMPLE_RATE
from transcription.audio.samples import AudioError, DecodedAudio, Frontend

Source = str | Path | bytes | BinaryIO

SOUNDFILE_CONTAINERS = frozenset({"wav", "w64", "flac", "ogg", "mp3", "aiff", "au", "caf", "voc", "ircam",
                                  "nistsphere"})
"""FFmpeg demuxers of the formats libsndfile (soundfile, ``librosa.load``'s first backend) reads; any other
audio file reaches ``librosa.load`` through audioread's FFmpeg as 16-bit samples (:class:`Frontend`)."""


def _soxr_16k(samples: np.ndarray, rate: int) -> np.ndarray:
    """``[channels, n]`` float32 at ``rate`` -> ``[channels, ceil(n * 16000 / rate)]`` (soxr ``soxr_hq``)."""
    if rate == SAMPLE_RATE:
        return samples
    import soxr  # only here: 16 kHz input, and machines without soxr (the GPU image), never need it
    n = math.ceil(samples.shape[1] * SAMPLE_RATE / rate)
    out = np.zeros((samples.shape[0], n), dtype=np.float32)
    for c, x in enumerate(samples):
        y = soxr.resample(np.ascontiguousarray(x), rate, SAMPLE_RATE, quality="soxr_hq")[:n]
        out[c, : len(y)] = y
    return out


def _reason(e: Exception) -> str:
    """What went wrong, without the file name FFmpeg appends (a server's temporary path must never reach
    a client; the caller knows which file it passed)."""
    return getattr(e, "strerror", None) or type(e).__name__


def _size(source: Source) -> int | None:
    """Bytes in ``source`` when that is known without reading it (a file, an in-memory buffer), else None
    (a missing file is left to PyAV, which reports it as before)."""
    if isinstance(source, (str, Path)):
        return os.path.getsize(source) if os.path.isfile(source) else None
    if isinstance(source, io.BytesIO):
        return source.getbuffer().nbytes - source.tell()
    return None


def open_media(source: Source) -> av.container.InputContainer:
    """The container of ``source``; the one opener of the decoder and of the API's intake
    (``api.intake.measure_duration``), so both refuse a bad file with the same code and message.

    Raises:
        AudioError: ``empty_audio`` for a zero-byte input, else ``decode_failed`` (the message gives FFmpeg's
            reason, never the path).
        FileNotFoundError: (PyAV's) no such file.
    """
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    if _size(source) == 0:
        raise AudioError("empty_audio", "the file is empty")
    try:
        return av.open(source if not isinstance(source, Path) else str(source), mode="r", metadata_errors="ignore")
    except av.error.FileNotFoundError:
        raise
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError) as e:
        raise AudioError("decode_failed", f"the file is not a readable media file ({_reason(e)})") from None


def first_audio_stream(container: av.container.InputContainer) -> av.audio.stream.AudioStream:
    """The first audio stream of ``container``. Raises AudioError ``no_audio_stream`` (a video without
    sound)."""
    if not container.streams.audio:
        raise AudioError("no_audio_stream", "the file has no audio stream")
    return container.streams.audio[0]


def undecodable(e: Exception) -> AudioError:
    """``decode_failed`` for an audio stream that opened but decoded to nothing, with FFmpeg's reason."""
    return AudioError("decode_failed", f"the audio stream could not be decoded ({_reason(e)})")


def no_samples() -> AudioError:
    """``empty_audio`` for an audio stream that decoded cleanly to zero samples."""
    return AudioError("empty_audio", "the file contains no audio samples")


def _finite_frame(frame: av.AudioFrame) -> tuple[av.AudioFrame, int, int]:
    """``(frame with NaN/inf values set to 0, how many were, values in the frame)``; before resampling,
    so a bad value is never smeared over its neighbours by the resampling filter."""
    total = frame.samples * (len(frame.layout.channels) or 1)
    if frame.format.name not in FLOAT_SAMPLE_FORMATS:
        return frame, 0, total
    values = frame.to_ndarray()
    if np.isfinite(values).all():
        return frame, 0, total
    values = np.array(values)  # writable copy
    bad = replace_nonfinite(values)
    clean = av.AudioFrame.from_ndarray(values, format=frame.format.name, layout=frame.layout.name)
    clean.sample_rate, clean.pts, clean.time_base = frame.sample_rate, frame.pts, frame.time_base
    return clean, bad, total


def decode_audio(source: Source, mono: bool = True, frontend: Frontend = Frontend.FFMPEG) -> DecodedAudio:
    """Decode the first audio stream of ``source`` and resample to 16 kHz float32.

    NaN/inf sample values are replaced by 0 and counted (``DecodedAudio.nonfinite``), or the input is
    refused when there are too many (the rule is :mod:`diarist.pcm`'s). Peak memory is about twice the
    decoded samples (the frames, then one array).

    Args:
        source: a path, bytes, or a binary file object.
        mono: downmix to one channel (as ``frontend`` mixes); else keep every channel.
        frontend: the channel mixing and rate conversion (:class:`Frontend`).
    Raises:
        AudioError: ``decode_failed``, ``no_audio_stream``, ``empty_audio`` or ``invalid_samples`` (see
            :class:`AudioError`).
    """
    if (fast := _pcm16_wav(source)) is not None:
        return fast  # 16 kHz mono: no mixing, no rate change, the same samples for every frontend
    ffmpeg = Frontend(frontend) is Frontend.FFMPEG
    with open_media(source) as container:
        stream = first_audio_stream(container)
        channels = stream.codec_context.channels or 1
        # librosa on video: the official MOSS-TD code reads it through PyAV as FFmpeg-mixed 16-bit mono 16 kHz
        video = not ffmpeg and mono and len(container.streams.video) > 0
        # librosa on what libsndfile cannot read: audioread's FFmpeg gives librosa 16-bit samples
        s16 = not ffmpeg and not video and container.format.name.split(",")[0] not in SOUNDFILE_CONTAINERS
        layout = "mono" if (ffmpeg or video) and (mono or channels == 1) else None
        chunks: list[np.ndarray] = []
        rate = stream.codec_context.sample_rate or None
        nonfinite = values = 0
        try:
            # librosa (no video): no FFmpeg mixing or rate change, only the conversion of the sample format
            resampler = av.AudioResampler(format="s16p" if s16 else "s16" if video else "fltp",
                                          layout=layout or stream.layout,
                                          rate=SAMPLE_RATE if ffmpeg or video else rate)
            for frame in container.decode(stream):
                frame, bad, n = _finite_frame(frame)
                nonfinite, values = nonfinite + bad, values + n
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray())
                    rate = rate or out.sample_rate
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray())
        except (av.error.FFmpegError, ValueError) as e:
            if not chunks:
                raise undecodable(e) from None
            # A truncated tail: keep what decoded (FFmpeg's own behaviour for damaged files).
        try:
            check_nonfinite(nonfinite, values)
        except InvalidSamples as e:
            raise AudioError(e.code, e.message) from None
        samples = np.concatenate(chunks, axis=1) if chunks else np.zeros((1, 0), np.float32)
        del chunks  # the frames' copies: from here on one array
        samples = samples.astype(np.float32, copy=False)
        if samples.shape[1] == 0:
            raise no_samples()
        if s16 or video:
            samples /= 32768.0  # librosa's and the official video path's int16 -> float
        if ffmpeg:
            np.clip(samples, -1.0, 1.0, out=samples)
        elif not video:  # (video: FFmpeg gave mono 16 kHz already)
            if mono and samples.shape[0] > 1:
                samples = samples.mean(axis=0, keepdims=True)
            samples = _soxr_16k(samples, int(rate or SAMPLE_RATE))
        return DecodedAudio(
            samples=np.ascontiguousarray(samples),
            source_sample_rate=stream.codec_context.sample_rate or SAMPLE_RATE,
            source_channels=channels,
            codec=stream.codec_context.name,
            container=container.format.name,
            nonfinite=nonfinite,
            source_values=values,
        )


def _pcm16_wav(source: Source) -> DecodedAudio | None:
    """A 16 kHz mono 16-bit PCM WAV file (what recorders and our own tools write) read without FFmpeg: the
    same samples PyAV gives (``s / 32768``), but in numpy, which releases the GIL while it converts, so a
    worker decoding many uploads at once is not serialised on per-frame Python work. ``None`` for
    anything else (other rates, channels, formats, or not a file path): that goes through PyAV."""
    if not isinstance(source, (str, Path)):
        return None
    try:
        with wave.open(str(source), "rb") as w:
            if (w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getcomptype()) != (SAMPLE_RATE, 1, 2, "NONE"):
                return None
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError, OSError, ValueError):
        return None
    if len(raw) < 2:
        return None  # let PyAV report the empty file with its code
    samples = np.frombuffer(raw, dtype="<i2", count=len(raw) // 2).astype(np.float32)
    samples *= np.float32(1 / 32768)
    return DecodedAudio(samples=samples.reshape(1, -1), source_sample_rate=SAMPLE_RATE, source_channels=1,
                        codec="pcm_s16le", container="wav")


def probe_duration(source: Source) -> float:
    """Duration in seconds: the container/stream header when present, else a full decode.

    Raises:
        AudioError: as :func:`decode_audio`.
    """
    if isinstance(source, (str, Path)):
        with open_media(source) as container:
            s = first_audio_stream(container)
            if s.duration is not None and s.time_base is not None and s.duration > 0:
                return float(s.duration * s.time_base)
            if container.duration and container.duration > 0:
                return container.duration / av.time_base
    return decode_audio(source).duration
