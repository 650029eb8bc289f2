"""Decoded audio and its vocabulary, without a decoder: :class:`DecodedAudio` (16 kHz float32 PCM and where it
came from, to and from the worker-to-engine wire), :class:`AudioError` (bad input, coded) and
:class:`Frontend` (how a model family's loader mixes and resamples).

numpy only: the engine server rebuilds a worker's samples with :meth:`DecodedAudio.from_pcm` without
importing PyAV (:mod:`transcription.audio.decode` is the decoder).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

import numpy as np

from diarist.contract.errors import CodedError
from diarist.pcm import (
    InvalidSamples,
    PcmFormat,
    check_nonfinite,
    damage_warning,
    nonfinite_warning,
    replace_nonfinite,
)
from engine.models.audio_input import SAMPLE_RATE


class AudioError(CodedError, ValueError):
    """Bad audio input (HTTP 422). ``code`` is a stable machine code for API errors.

    Codes: ``decode_failed`` (not a media file, or corrupt), ``no_audio_stream`` (a container with no audio,
    e.g. a video without sound), ``empty_audio`` (zero samples after decoding), ``invalid_pcm`` (a decoded
    body from a worker that does not match its header), ``invalid_samples`` (too many NaN/inf sample
    values, :mod:`diarist.pcm`).
    """

    status = 422


@dataclass
class DecodedAudio:
    """Decoded PCM.

    Attributes:
        samples: float32 in [-1, 1], ``[channels, n]`` at ``SAMPLE_RATE`` (``channels == 1`` unless
            ``mono=False`` was asked for).
        source_sample_rate: the stream's own rate (Hz); source_channels: its channel count.
        codec, container: FFmpeg names.
        nonfinite: NaN/inf sample values of the stream that were replaced by 0 (:mod:`diarist.pcm`), of
            ``source_values`` values decoded.
        damaged: stretches of the stream that could not be decoded and were skipped (damaged packets, or a
            container that could not be read to its end); ``damaged_s``: the seconds of audio they held.
    """

    samples: np.ndarray
    source_sample_rate: int
    source_channels: int
    codec: str
    container: str
    nonfinite: int = 0
    source_values: int = 0
    damaged: int = 0
    damaged_s: float = 0.0

    @property
    def warnings(self) -> list[dict]:
        """Result warnings about the input (``[{code, message, count}]``; empty for clean audio)."""
        out = [nonfinite_warning(self.nonfinite, self.source_values)] if self.nonfinite else []
        return out + ([damage_warning(self.damaged, self.damaged_s)] if self.damaged else [])

    @property
    def duration(self) -> float:
        """Seconds."""
        return self.samples.shape[-1] / SAMPLE_RATE

    @property
    def mono(self) -> np.ndarray:
        """float32 ``[n]``: the mean of the channels."""
        return self.samples.mean(axis=0) if self.samples.shape[0] > 1 else self.samples[0]

    def pcm_format(self) -> PcmFormat:
        """The wire layout of :meth:`pcm_bytes` (``diarist.pcm``; sent by ``engine_server.protocol``)."""
        return PcmFormat(channels=self.samples.shape[0], frames=self.samples.shape[1], sample_rate=SAMPLE_RATE,
                         source_sample_rate=self.source_sample_rate, source_channels=self.source_channels,
                         codec=self.codec, container=self.container, nonfinite=self.nonfinite,
                         source_values=self.source_values, damaged=self.damaged, damaged_s=self.damaged_s)

    def pcm_chunks(self, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The samples as float32 little endian, channel-major, in pieces of ``chunk_bytes`` (a request body
        streamed without one whole-recording copy)."""
        view = memoryview(np.ascontiguousarray(self.samples, dtype="<f4")).cast("B")
        for i in range(0, len(view), chunk_bytes):
            yield bytes(view[i : i + chunk_bytes])

    @classmethod
    def from_pcm(cls, fmt: PcmFormat, body: bytes | bytearray) -> DecodedAudio:
        """Rebuild what :meth:`pcm_format` and :meth:`pcm_chunks` sent (no copy of ``body``).

        Raises:
            AudioError: ``invalid_pcm`` when the body's size or rate does not match ``fmt``;
                ``invalid_samples`` when too many of its values are NaN/inf (they are counted here, not
                taken from the header, and replaced by 0 below the limit).
        """
        if fmt.sample_rate != SAMPLE_RATE:
            raise AudioError("invalid_pcm", f"PCM at {fmt.sample_rate} Hz; the engine takes {SAMPLE_RATE} Hz")
        if len(body) != fmt.nbytes:
            raise AudioError("invalid_pcm", f"PCM body of {len(body)} bytes; the header says {fmt.nbytes}")
        samples = np.frombuffer(body, dtype="<f4").reshape(fmt.channels, fmt.frames)
        # The header's count is the decoder's (values of the source); the body is checked too, since the
        # engine never reads non-finite samples as silence whoever sent them.
        here = int(np.count_nonzero(~np.isfinite(samples)))
        if here:
            samples = samples.copy() if not samples.flags.writeable else samples
            replace_nonfinite(samples)
        nonfinite, values = max(fmt.nonfinite, here), max(fmt.source_values, samples.size)
        try:
            check_nonfinite(nonfinite, values)
        except InvalidSamples as e:
            raise AudioError(e.code, e.message) from None
        return cls(samples=samples, source_sample_rate=fmt.source_sample_rate,
                   source_channels=fmt.source_channels, codec=fmt.codec, container=fmt.container,
                   nonfinite=nonfinite, source_values=values, damaged=fmt.damaged, damaged_s=fmt.damaged_s)


class Frontend(str, Enum):
    """How :func:`decode_audio` mixes channels and converts the rate.

    ``ffmpeg``: FFmpeg's downmix matrix and resampler (libswresample), as ``ffmpeg -ac 1 -ar 16000`` in
    openai-whisper's loader. Its stereo-to-mono matrix gives (L+R)/sqrt(2), 3 dB above the average.

    ``librosa``: the official MOSS-TD code's loader (OpenMOSS ``inference_utils.load_audio_item``). A non-video
    file: decode at the source rate, average the channels, resample each with soxr ``soxr_hq`` and pad/trim
    to ``ceil(n * 16000 / rate)`` samples, no clipping: ``librosa.load`` and ``transformers.audio_utils
    .load_audio`` (soundfile backend); a container libsndfile cannot read (m4a, mp4 audio, webm, ...;
    :data:`transcription.audio.decode.SOUNDFILE_CONTAINERS`) reaches ``librosa.load`` through audioread's
    FFmpeg, which hands over 16-bit samples, so those are rounded to 16 bits at the source rate first. A
    container with a video stream: FFmpeg's downmix and resampler to 16-bit mono 16 kHz (the official code
    reads video through PyAV so). docs/moss_td.md states what remains different and why.
    """

    FFMPEG = "ffmpeg"
    LIBROSA = "librosa"

    @classmethod
    def for_family(cls, family: str) -> Frontend:
        """The frontend of a model family's official loader (:attr:`engine.config.ModelFamily.frontend`:
        ``ffmpeg`` for ``whisper``, ``librosa`` for ``moss-td``). Whoever decodes for an engine (a family's
        pipeline, a worker) asks here. Raises ValueError for an unknown family."""
        from engine.config import FAMILIES  # torch-free

        if family not in FAMILIES:
            raise ValueError(f"unknown model family {family!r}")
        return cls(FAMILIES[family].frontend)
