"""Decoded samples between processes (:class:`PcmFormat`, their layout) and the rule for samples that are
not numbers: NaN or ±inf in a float PCM stream.

Float WAV/FLAC/CAF files can carry NaN and ±inf values (a broken mixer, a bad export). Read as they are,
they poison the resampler, the VAD and the log-mel (a NaN turns a whole 30 s window into "no speech").
The rule, applied where the API measures an upload (``api/intake.py``) and where the pipeline decodes it
(``transcription/audio/decode.py``), is written once here:

- at most :data:`MAX_NONFINITE_FRACTION` of the sample values non-finite: each is replaced by 0 (silence
  for that one sample), and the result says how many in its ``warnings`` (code ``invalid_samples``);
- more than that: the input is refused with 422 ``invalid_samples`` (:class:`InvalidSamples`); zeroing a
  large part of a recording would quietly read it as silence.

Counts are of sample *values* (one per channel per sample instant), in the stream as decoded, before
resampling and downmixing, so that one bad value is counted once and never spread by a filter.
Torch-free: the API imports it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from diarist.contract.errors import CodedError

MAX_NONFINITE_FRACTION = 0.01
"""Largest share of non-finite sample values replaced by 0; above it the input is refused."""

WARNING_CODE = "invalid_samples"

FLOAT_SAMPLE_FORMATS = frozenset({"flt", "fltp", "dbl", "dblp"})
"""FFmpeg sample formats that can hold NaN/inf (float and double, packed or planar); integer PCM cannot."""


class InvalidSamples(CodedError, ValueError):
    """Too many NaN/inf sample values to transcribe (``code`` ``invalid_samples``, HTTP 422)."""

    status = 422

    def __init__(self, message: str) -> None:
        super().__init__(WARNING_CODE, message)


def replace_nonfinite(values: np.ndarray) -> int:
    """Set every NaN/±inf of the float array ``values`` to 0 in place; returns how many there were.

    Integer arrays cannot hold such values and are left alone (0)."""
    if values.dtype.kind != "f":
        return 0
    bad = ~np.isfinite(values)
    n = int(np.count_nonzero(bad))
    if n:
        values[bad] = 0.0
    return n


def check_nonfinite(count: int, total: int) -> None:
    """Raise :class:`InvalidSamples` when ``count`` of ``total`` sample values exceed the tolerated share."""
    if total > 0 and count > MAX_NONFINITE_FRACTION * total:
        raise InvalidSamples(f"{count} of the {total} sample values are NaN or infinite "
                             f"({100 * count / total:.2f}%, more than the {100 * MAX_NONFINITE_FRACTION:g}% "
                             "that are replaced by silence); the file is damaged, export it again")


def nonfinite_warning(count: int, total: int) -> dict:
    """The result warning for ``count`` replaced values: ``{code, message, count}``."""
    return {"code": WARNING_CODE, "count": count,
            "message": f"{count} of the {total} sample values were NaN or infinite and were replaced by 0"}


DAMAGED_CODE = "damaged_audio"
"""Result warning code: parts of the file could not be decoded and were skipped (:func:`damage_warning`)."""


def damage_warning(packets: int, lost_s: float) -> dict:
    """The result warning for ``packets`` stretches of the stream that could not be decoded (damaged
    packets skipped, or a container that could not be read to its end), about ``lost_s`` seconds of audio
    in all: ``{code, message, count}``."""
    return {"code": DAMAGED_CODE, "count": packets,
            "message": f"{packets} damaged part(s) of the audio could not be decoded and were skipped (about "
                       f"{lost_s:.1f} s of audio); decoding resumed after each, so the times after a damaged "
                       "part may be early by up to what it held"}


@dataclass(frozen=True)
class PcmFormat:
    """The layout of a decoded-audio body: float32 little endian, channel-major (``[channels, frames]`` in
    C order, so ``channels * frames * 4`` bytes), at ``sample_rate`` Hz, plus what the decoder learned of the
    source. The worker decodes the upload it already holds (PyAV) and sends this (``engine_server.protocol``'s
    ``PCM_HEADER``), so the engine process spends no CPU on FFmpeg beside the thread that drives the GPU.

    Attributes:
        channels, frames: the body's shape; sample_rate: Hz (the engine refuses any but its models' rate).
        source_sample_rate (Hz), source_channels, codec, container: of the uploaded file (FFmpeg names).
        nonfinite, source_values: NaN/inf sample values the decoder replaced by 0, of the values it read
            (``diarist.pcm``; the engine reports them in the result's warnings).
        frontend: how the samples were mixed and resampled (``transcription.audio.Frontend``: ``ffmpeg`` or
            ``librosa``); the engine refuses samples decoded for another family than its own (``""``: not
            stated, taken as they are).
        damaged, damaged_s: stretches of the source the decoder skipped as undecodable and the seconds of
            audio they held (:func:`damage_warning`, also in the result's warnings).
    """

    channels: int
    frames: int
    sample_rate: int
    source_sample_rate: int
    source_channels: int
    codec: str = ""
    container: str = ""
    nonfinite: int = 0
    source_values: int = 0
    frontend: str = ""
    damaged: int = 0
    damaged_s: float = 0.0

    @property
    def nbytes(self) -> int:
        """Size of the body in bytes."""
        return self.channels * self.frames * 4

    def to_header(self) -> str:
        """ASCII JSON of every field."""
        return json.dumps(asdict(self), ensure_ascii=True)

    @classmethod
    def from_header(cls, value: str) -> PcmFormat:
        """Parse :meth:`to_header`'s output.

        Raises:
            ValueError: not JSON, a missing or unknown field, a wrong type, or a non-positive count.
        """
        raw = json.loads(value)
        if not isinstance(raw, dict):
            raise ValueError("the PCM header must be a JSON object")  # noqa: TRY004 - one error type: a 400
        fmt = cls(**raw)
        ints = (fmt.channels, fmt.frames, fmt.sample_rate, fmt.source_sample_rate, fmt.source_channels)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or min(ints) < 1:
            raise ValueError(f"the PCM header's counts must be positive integers: {raw}")
        if not all(isinstance(v, str) for v in (fmt.codec, fmt.container, fmt.frontend)):
            raise ValueError("the PCM header's codec, container and frontend must be strings")
        counts = (fmt.nonfinite, fmt.source_values)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
            raise ValueError(f"the PCM header's nonfinite and source_values must be integers >= 0: {raw}")
        if not (isinstance(fmt.damaged, int) and not isinstance(fmt.damaged, bool) and fmt.damaged >= 0
                and isinstance(fmt.damaged_s, (int, float)) and not isinstance(fmt.damaged_s, bool)
                and 0 <= fmt.damaged_s < float("inf")):
            raise ValueError(f"the PCM header's damaged and damaged_s must be numbers >= 0: {raw}")
        return fmt
