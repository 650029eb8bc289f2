"""The rule for decoded samples that are not numbers: NaN or ±inf in a float PCM stream.

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

import numpy as np

MAX_NONFINITE_FRACTION = 0.01
"""Largest share of non-finite sample values replaced by 0; above it the input is refused."""

WARNING_CODE = "invalid_samples"

FLOAT_SAMPLE_FORMATS = frozenset({"flt", "fltp", "dbl", "dblp"})
"""FFmpeg sample formats that can hold NaN/inf (float and double, packed or planar); integer PCM cannot."""


class InvalidSamples(ValueError):
    """Too many NaN/inf sample values to transcribe (``code`` ``invalid_samples``, HTTP 422)."""

    code = WARNING_CODE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
