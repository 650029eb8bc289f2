"""Audio intake at submit: receive (upload or URL) to a temp file within the size limit, measure, check limits.

The duration is measured before the job exists because it decides the queue and the limits (413, 422
``too_long`` / ``too_short``) and because a file that cannot be decoded should be refused with its code at
once (422 ``decode_failed`` / ``no_audio_stream`` / ``empty_audio``) rather than fail later in a worker.
Measuring must not hold the upload: decoding a whole 3-hour MP3 took 83 s of the POST (issue 33), so the
duration comes from the container header whenever it has one, and only the first
:data:`PROBE_DECODE_S` seconds are decoded (:func:`measure_duration` says when the whole file is).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from diarist.http.errors import ApiError
from diarist.netguard import UnsafeURL, check_url
from diarist.pcm import FLOAT_SAMPLE_FORMATS, InvalidSamples, check_nonfinite
from diarist.redact import redact_text
from diarist.settings import Settings
from transcription.audio.decode import (
    Damage,
    decoded_frames,
    first_audio_stream,
    frame_values,
    header_duration_s,
    no_samples,
    open_media,
    undecodable,
)
from transcription.audio.samples import AudioError

CHUNK = 1 << 20
# Above this size only the container header is read (a full decode of a huge file would stall the API).
FULL_DECODE_MAX_BYTES = 512 << 20
PROBE_DECODE_S = 30.0
"""Seconds of audio decoded from the start of a file whose header gives its duration: enough to refuse an
undecodable stream or one of non-finite samples with its code, a bounded cost whatever the file's length."""
HEADER_MARGIN = 0.1
"""A header duration within this fraction of the duration limit is not trusted for the limit: the whole file
is decoded to measure it (header durations of VBR files without an index are estimates)."""


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the audio is larger than the limit of {limit} bytes")


def save_stream(src: BinaryIO, limit: int, dest_dir: str | None = None) -> tuple[Path, int, str]:
    """Copy ``src`` to a new temp file in 1 MiB chunks; 413 ``too_large`` past ``limit`` bytes.
    Returns ``(path, size in bytes, SHA-256 hex of the content)``."""
    fd, name = tempfile.mkstemp(prefix="diarist-upload-", dir=dest_dir)
    size, digest = 0, hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), size, digest.hexdigest()


def fetch_url(url: str, headers: dict[str, str] | None, settings: Settings) -> tuple[Path, int]:
    """Download ``audio_url`` to a temp file (size-limited; non-global addresses refused unless in
    ``DIARIST_AUDIO_URL_ALLOW_HOSTS``). Error messages never repeat the URL's credentials or query string.

    Raises ApiError: 422 ``invalid_url`` / ``url_not_allowed`` / ``url_fetch_failed``, 413 ``too_large``.
    """
    import httpx

    try:
        check_url(url, settings.audio_url_allow_hosts, setting="DIARIST_AUDIO_URL_ALLOW_HOSTS")
    except UnsafeURL as e:
        raise ApiError(422, e.code, e.message) from None
    fd, name = tempfile.mkstemp(prefix="diarist-url-")
    size = 0
    try:
        with os.fdopen(fd, "wb") as out, httpx.stream("GET", url, headers=headers or {}, follow_redirects=False,
                                                      timeout=settings.url_fetch_timeout_s) as r:
            if r.status_code != 200:
                raise ApiError(422, "url_fetch_failed", f"fetching audio_url answered HTTP {r.status_code}")
            for chunk in r.iter_bytes(CHUNK):
                size += len(chunk)
                if size > settings.max_upload_bytes:
                    raise _too_large(settings.max_upload_bytes)
                out.write(chunk)
    except httpx.HTTPError as e:
        Path(name).unlink(missing_ok=True)
        reason = redact_text(str(e))
        raise ApiError(422, "url_fetch_failed",
                       f"could not fetch audio_url: {type(e).__name__}: {reason}") from None
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), size


def measure_duration(path: Path, limit_s: float | None = None) -> float:
    """Audio duration in seconds of the first audio stream.

    From the container header (the stream's duration, else the container's) when it has one, with only
    the first :data:`PROBE_DECODE_S` seconds decoded; by decoding every frame (counted, nothing kept) when
    it has none, when the file is shorter than that anyway, when the file holds fewer than half the bytes
    its header's duration needs at the stream's bit rate (cut short), or when the header puts the file
    within :data:`HEADER_MARGIN` of ``limit_s`` (the duration limit, seconds), so that a ``too_long``
    refusal at the limit is exact. Files above ``FULL_DECODE_MAX_BYTES``
    are never decoded in full (header only). The worker decodes the whole file later; the result's
    ``duration`` is that exact length. What is decoded is checked as the engine's decoder checks it:
    damaged packets are skipped and a damaged tail keeps what decoded
    (:func:`transcription.audio.decode.decoded_frames`); float streams are checked for NaN/inf values
    (:mod:`diarist.pcm`: a few are replaced later and reported in the result; too many are refused here).
    The file is opened, and refused, as the decoder does (:mod:`transcription.audio.decode`: one wording
    for the API, the engine server and the CLI; never the temp path).

    Raises:
        ApiError: 422 ``decode_failed``, ``no_audio_stream``, ``empty_audio``, ``invalid_samples``.
    """
    try:
        return _measure(path, limit_s)
    except (AudioError, InvalidSamples) as e:
        raise ApiError(422, e.code, e.message) from None


def _measure(path: Path, limit_s: float | None) -> float:
    """:func:`measure_duration` (seconds), its refusals as the decoder's AudioError / InvalidSamples."""
    with open_media(path) as container:
        stream = first_audio_stream(container)
        header = header_duration_s(container, stream)
        if header is not None and path.stat().st_size > FULL_DECODE_MAX_BYTES:
            return header
        near_limit = limit_s is not None and header is not None and abs(header - limit_s) <= HEADER_MARGIN * limit_s
        # a file cut short keeps its header's duration: fewer bytes than half the header's length at the
        # stream's bit rate means the header describes a file that is not all there
        bit_rate = stream.bit_rate or stream.codec_context.bit_rate
        cut = header is not None and bool(bit_rate) and path.stat().st_size * 8 < 0.5 * header * bit_rate
        full = header is None or near_limit or cut
        samples, rate, damage, probed = 0, stream.codec_context.sample_rate or 0, Damage(), False
        values = nonfinite = 0
        for frame in decoded_frames(container, stream, damage):  # past damage, as the decoder reads it
            samples += frame.samples
            rate = frame.sample_rate or rate
            values += frame.samples * (len(frame.layout.channels) or 1)
            if frame.format.name in FLOAT_SAMPLE_FORMATS:
                nonfinite += int(np.count_nonzero(~np.isfinite(frame_values(frame))))
            if not full and rate and samples >= PROBE_DECODE_S * rate:
                probed = True  # stopped early: the header's duration stands
                break
        check_nonfinite(nonfinite, values)
        if samples == 0 or not rate:
            raise no_samples() if damage.error is None else undecodable(damage.error)
        return header if probed else samples / rate


def duration_limit_s(settings: Settings) -> float:
    """The longest audio (seconds) taken: the served model family's limit
    (:func:`transcription.limits.max_duration_s`), lowered by ``DIARIST_MAX_DURATION_S`` when set."""
    from transcription.limits import max_duration_s  # torch-free

    family = max_duration_s(settings.model)
    return family if settings.max_duration_s is None else min(settings.max_duration_s, family)


def min_duration_s(settings: Settings) -> float:
    """The shortest audio (seconds) taken: :data:`transcription.limits.MIN_DURATION_S`, raised by
    ``DIARIST_MIN_DURATION_S`` when set."""
    from transcription.limits import MIN_DURATION_S  # torch-free

    return max(MIN_DURATION_S, settings.min_duration_s or 0.0)


def check_duration(duration: float, settings: Settings) -> None:
    """422 ``too_long`` / ``too_short`` against the limits (seconds; :func:`duration_limit_s`,
    :func:`min_duration_s`)."""
    from transcription.limits import too_short_message

    limit = duration_limit_s(settings)
    if duration > limit:
        raise ApiError(422, "too_long", f"the audio lasts {duration:.1f} s; the limit for the {settings.model} "
                                        f"model is {limit:g} s ({limit / 3600:.2f} h)")
    if duration < (shortest := min_duration_s(settings)):
        raise ApiError(422, "too_short", too_short_message(duration, shortest))


def discard(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
