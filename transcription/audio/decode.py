"""Decode any container FFmpeg reads (through PyAV) to 16 kHz float32 PCM."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np

from engine.models.mel import SAMPLE_RATE


class AudioError(ValueError):
    """Bad audio input. ``code`` is a stable machine code for API errors.

    Codes: ``decode_failed`` (not a media file, or corrupt), ``no_audio_stream`` (a container with no audio,
    e.g. a video without sound), ``empty_audio`` (zero samples after decoding).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class DecodedAudio:
    """Decoded PCM.

    Attributes:
        samples: float32 in [-1, 1], ``[channels, n]`` at ``SAMPLE_RATE`` (``channels == 1`` unless
            ``mono=False`` was asked for).
        source_sample_rate: the stream's own rate (Hz); source_channels: its channel count.
        codec, container: FFmpeg names.
    """

    samples: np.ndarray
    source_sample_rate: int
    source_channels: int
    codec: str
    container: str

    @property
    def duration(self) -> float:
        """Seconds."""
        return self.samples.shape[-1] / SAMPLE_RATE

    @property
    def mono(self) -> np.ndarray:
        """float32 ``[n]``: the mean of the channels."""
        return self.samples.mean(axis=0) if self.samples.shape[0] > 1 else self.samples[0]


Source = str | Path | bytes | BinaryIO


def _open(source: Source) -> av.container.InputContainer:
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    try:
        return av.open(source if not isinstance(source, Path) else str(source), mode="r", metadata_errors="ignore")
    except av.error.FileNotFoundError:
        raise
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError) as e:
        raise AudioError("decode_failed", f"could not open the input as a media file: {e}") from None


def decode_audio(source: Source, mono: bool = True) -> DecodedAudio:
    """Decode the first audio stream of ``source`` and resample to 16 kHz float32.

    Args:
        source: a path, bytes, or a binary file object.
        mono: downmix to one channel (FFmpeg's mixing matrix); else keep every channel.
    Raises:
        AudioError: ``decode_failed``, ``no_audio_stream`` or ``empty_audio`` (see :class:`AudioError`).
    """
    with _open(source) as container:
        streams = container.streams.audio
        if not streams:
            raise AudioError("no_audio_stream", "the file has no audio stream")
        stream = streams[0]
        channels = stream.codec_context.channels or 1
        layout = "mono" if mono or channels == 1 else None
        chunks: list[np.ndarray] = []
        try:
            resampler = av.AudioResampler(format="fltp", layout=layout or stream.layout, rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray())
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray())
        except (av.error.FFmpegError, ValueError) as e:
            if not chunks:
                raise AudioError("decode_failed", f"the audio stream could not be decoded: {e}") from None
            # A truncated tail: keep what decoded (FFmpeg's own behaviour for damaged files).
        samples = np.concatenate(chunks, axis=1).astype(np.float32) if chunks else np.zeros((1, 0), np.float32)
        if samples.shape[1] == 0:
            raise AudioError("empty_audio", "the file contains no audio samples")
        return DecodedAudio(
            samples=np.ascontiguousarray(np.clip(samples, -1.0, 1.0)),
            source_sample_rate=stream.codec_context.sample_rate or SAMPLE_RATE,
            source_channels=channels,
            codec=stream.codec_context.name,
            container=container.format.name,
        )


def probe_duration(source: Source) -> float:
    """Duration in seconds: the container/stream header when present, else a full decode.

    Raises:
        AudioError: as :func:`decode_audio`.
    """
    if isinstance(source, (str, Path)):
        with _open(source) as container:
            streams = container.streams.audio
            if not streams:
                raise AudioError("no_audio_stream", "the file has no audio stream")
            s = streams[0]
            if s.duration is not None and s.time_base is not None and s.duration > 0:
                return float(s.duration * s.time_base)
            if container.duration and container.duration > 0:
                return container.duration / av.time_base
    return decode_audio(source).duration
