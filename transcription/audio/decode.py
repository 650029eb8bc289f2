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
from collections.abc import Iterator
from dataclasses import dataclass
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


_DTYPES = {"u8": np.uint8, "s16": np.int16, "s32": np.int32, "s64": np.int64, "flt": np.float32, "dbl": np.float64}


def frame_values(frame: av.AudioFrame) -> np.ndarray:
    """The samples of a decoded ``frame``, ``[channels, samples]`` in its own sample format (a view).

    Planar frames are read plane by plane rather than with ``AudioFrame.to_ndarray``: PyAV 18 lists one
    plane too many for a planar frame of 8 or more channels, and ``to_ndarray`` then reads past the frame
    (a segmentation fault on any 7.1 AAC file: the API's intake and the worker's decoder died with it).
    """
    channels = len(frame.layout.channels) or 1
    dtype = _DTYPES[frame.format.packed.name]
    if not frame.format.is_planar:
        return np.frombuffer(frame.planes[0], dtype=dtype, count=frame.samples * channels
                             ).reshape(frame.samples, channels).T
    planes = frame.planes
    return np.stack([np.frombuffer(planes[c], dtype=dtype, count=frame.samples) for c in range(channels)])


def _packed_frame(values: np.ndarray, like: av.AudioFrame, layout: str) -> av.AudioFrame:
    """A frame of ``values`` (``[channels, samples]``, ``like``'s sample type) in ``like``'s packed format
    under ``layout``, with its rate and times (packed: PyAV 18 cannot fill a planar frame of 8 channels)."""
    out = av.AudioFrame.from_ndarray(np.ascontiguousarray(values.T).reshape(1, -1),
                                     format=like.format.packed.name, layout=layout)
    out.sample_rate, out.pts, out.time_base = like.sample_rate, like.pts, like.time_base
    return out


def _finite_frame(frame: av.AudioFrame) -> tuple[av.AudioFrame, int, int]:
    """``(frame with NaN/inf values set to 0, how many were, values in the frame)``; before resampling,
    so a bad value is never smeared over its neighbours by the resampling filter."""
    total = frame.samples * (len(frame.layout.channels) or 1)
    if frame.format.name not in FLOAT_SAMPLE_FORMATS:
        return frame, 0, total
    values = frame_values(frame)
    if np.isfinite(values).all():
        return frame, 0, total
    values = np.array(values)  # writable copy
    bad = replace_nonfinite(values)
    return _packed_frame(values, frame, frame.layout.name), bad, total


@dataclass
class Damage:
    """What :func:`decoded_frames` could not decode.

    Attributes:
        parts: packets skipped because they failed to decode, plus one when the container could not be read
            to its end (the rest of the file is lost).
        packet_s: the seconds the skipped packets said they held (often unknown for a damaged packet).
        error: the first FFmpeg error, for a message.
    """

    parts: int = 0
    packet_s: float = 0.0
    error: Exception | None = None

    def lost_s(self, decoded_s: float, header_s: float | None) -> float:
        """Seconds of audio lost (0 when nothing was): what the header says the stream lasts less what
        decoded (a damaged MP3 frame is skipped by the parser with the bytes around it, so the packets'
        own durations undercount), or the packets' durations when the header says nothing or less."""
        if not self.parts:
            return 0.0
        return max(self.packet_s, (header_s or 0.0) - decoded_s)


def decoded_frames(container: av.container.InputContainer, stream: av.audio.stream.AudioStream,
                   damage: Damage) -> Iterator[av.AudioFrame]:
    """The audio frames of ``stream``, decoded packet by packet past damage, as the ``ffmpeg`` tool does
    (it reports "Error while decoding stream" and goes on with the next packet; the demuxer's parser finds
    the next frame header): a packet that fails to decode is skipped and counted in ``damage``, and a
    container that cannot be read further ends the frames (counted too) instead of raising."""
    try:
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except (av.error.FFmpegError, ValueError) as e:
                damage.parts += 1
                if packet.duration and packet.time_base:
                    damage.packet_s += float(packet.duration * packet.time_base)
                damage.error = damage.error or e
                continue
            yield from frames
    except (av.error.FFmpegError, ValueError) as e:
        damage.parts += 1
        damage.error = damage.error or e


def header_duration_s(container: av.container.InputContainer, stream: av.audio.stream.AudioStream) -> float | None:
    """Seconds the stream (else the container) header says the audio lasts, or ``None`` when neither does."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration and container.duration > 0:
        return container.duration / av.time_base
    return None


GUESSED_LAYOUTS = {1: "mono", 2: "stereo", 3: "2.1", 4: "4.0", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}
"""The channel layout FFmpeg assumes for a stream that gives only a channel count (a WAV without a channel
mask, raw PCM): ``av_channel_layout_default`` (libavutil/channel_layout.c), which the ``ffmpeg`` tool applies
to such input ("Guessed Channel Layout", fftools/ffmpeg_demux.c) before it downmixes."""


def _guessed_layout(layout: av.AudioLayout) -> str | None:
    """The layout to read a stream of ``layout`` as: FFmpeg's guess (:data:`GUESSED_LAYOUTS`) when the
    stream names no channels (unspecified order), else ``None`` (the stream's own layout is used)."""
    if any(c.name != "NONE" for c in layout.channels):
        return None
    return GUESSED_LAYOUTS.get(layout.nb_channels)


def _relabel(frame: av.AudioFrame, layout: str) -> av.AudioFrame:
    """``frame``'s samples under the channel ``layout`` (same count; the samples are copied)."""
    return _packed_frame(frame_values(frame), frame, layout)


def downmix(samples: np.ndarray, frontend: Frontend = Frontend.FFMPEG) -> np.ndarray:
    """float32 ``[channels, n]`` at 16 kHz -> ``[1, n]`` as ``frontend`` mixes: ``librosa`` averages the
    channels; ``ffmpeg`` applies libswresample's default downmix matrix to the layout FFmpeg guesses for the
    channel count (:data:`GUESSED_LAYOUTS`; libswresample/rematrix.c ``swr_build_matrix``: front left and
    right at 1/sqrt(2), centre at 1, surrounds at 1/2, LFE 0, unnormalised for float output), the matrix
    :func:`decode_audio` applies to a file. More than 8 channels have no guessed layout: averaged."""
    if samples.shape[0] == 1:
        return samples
    layout = GUESSED_LAYOUTS.get(samples.shape[0])
    if Frontend(frontend) is not Frontend.FFMPEG or layout is None:
        return samples.mean(axis=0, keepdims=True)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.T, dtype=np.float32).reshape(1, -1),
                                       format="flt", layout=layout)
    frame.sample_rate = SAMPLE_RATE
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    out = [f.to_ndarray() for f in resampler.resample(frame)] + [f.to_ndarray() for f in resampler.resample(None)]
    return np.concatenate(out, axis=1)[:, : samples.shape[1]].astype(np.float32, copy=False)


def decode_audio(source: Source, mono: bool = True, frontend: Frontend = Frontend.FFMPEG) -> DecodedAudio:
    """Decode the first audio stream of ``source`` and resample to 16 kHz float32.

    NaN/inf sample values are replaced by 0 and counted (``DecodedAudio.nonfinite``), or the input is
    refused when there are too many (the rule is :mod:`diarist.pcm`'s). Peak memory is about twice the
    decoded samples (the frames, then one array).

    Args:
        source: a path, bytes, or a binary file object.
        mono: downmix to one channel (as ``frontend`` mixes: with ``ffmpeg``, libswresample's default
            matrix, centre and fronts weighted (:func:`downmix`), and a stream that names no channels read
            in the layout FFmpeg guesses for its count, :data:`GUESSED_LAYOUTS`); else keep every channel.
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
        guessed = _guessed_layout(stream.layout) if layout == "mono" and channels > 1 else None
        chunks: list[np.ndarray] = []
        rate = stream.codec_context.sample_rate or None
        nonfinite = values = 0
        damage, decoded_s = Damage(), 0.0
        try:
            # librosa (no video): no FFmpeg mixing or rate change, only the conversion of the sample format
            # (packed formats: frame_values)
            resampler = av.AudioResampler(format="s16" if s16 or video else "flt", layout=layout or stream.layout,
                                          rate=SAMPLE_RATE if ffmpeg or video else rate)
            for frame in decoded_frames(container, stream, damage):
                frame, bad, n = _finite_frame(frame)
                nonfinite, values = nonfinite + bad, values + n
                decoded_s += frame.samples / (frame.sample_rate or SAMPLE_RATE)
                if guessed is not None:  # no channel names: FFmpeg's guess, so the downmix weighs them
                    frame = _relabel(frame, guessed)
                for out in resampler.resample(frame):
                    chunks.append(frame_values(out))
                    rate = rate or out.sample_rate
            for out in resampler.resample(None):
                chunks.append(frame_values(out))
        except (av.error.FFmpegError, ValueError) as e:  # the resampler (the decoder's errors are damage)
            damage.parts, damage.error = damage.parts + 1, damage.error or e
        if not chunks and damage.error is not None:
            raise undecodable(damage.error)
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
            if mono:
                samples = downmix(samples, Frontend.LIBROSA)
            samples = _soxr_16k(samples, int(rate or SAMPLE_RATE))
        return DecodedAudio(
            samples=np.ascontiguousarray(samples),
            source_sample_rate=stream.codec_context.sample_rate or SAMPLE_RATE,
            source_channels=channels,
            codec=stream.codec_context.name,
            container=container.format.name,
            nonfinite=nonfinite,
            source_values=values,
            damaged=damage.parts,
            damaged_s=damage.lost_s(decoded_s, header_duration_s(container, stream)),
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
