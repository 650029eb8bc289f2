"""The decode windows of a Whisper transcript and their scores: where verbose_json's per-segment numbers
come from.

Whisper decodes a recording in windows of at most 30 s (``transcription.whisper.window_decoder``); each window's
kept attempt has a ``temperature``, a ``compression_ratio`` of its text, a mean token log-probability
``avg_logprob`` (nats) and the model's ``no_speech_prob`` at its start (the engine result's ``windows``,
``transcription.decode_quality.AttemptQuality``). Every segment of a window shares its window's scores, as
in OpenAI Whisper, whose ``transcribe`` copies one decode's scores onto each of its segments. MOSS-TD
decodes the recording as one sequence and reports no windows: its segments have no scores (``None``).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from diarist.times import round_seconds


class DecodeWindow(BaseModel):
    """One decoded window: ``start``/``end`` seconds (its kept span), ``channel`` (multichannel jobs, else
    ``None``) and the kept attempt's scores, each ``None`` when the engine did not report it."""

    model_config = ConfigDict(allow_inf_nan=False)

    start: float = Field(ge=0, description="seconds")
    end: float = Field(ge=0, description="seconds")
    channel: int | None = None
    temperature: float | None = None
    avg_logprob: float | None = Field(None, description="mean log-probability of the output tokens, nats")
    compression_ratio: float | None = None
    no_speech_prob: float | None = Field(None, ge=0, le=1)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_windows(raw: list[Any] | None, duration: float) -> list[DecodeWindow] | None:
    """The engine result's ``windows`` (free-form dicts, read leniently) as :class:`DecodeWindow` items,
    times clamped to ``[0, duration]`` and rounded to the millisecond, sorted by start. A window without a
    finite ``start`` and ``end`` is dropped (it says nothing about which segments it wrote); ``None`` when
    the result has no windows (MOSS-TD, or a result stored before they were kept)."""
    if not raw:
        return None
    out = []
    for w in raw:
        if not isinstance(w, dict) or (start := _num(w.get("start"))) is None or (end := _num(w.get("end"))) is None:
            continue
        start = round_seconds(min(max(start, 0.0), duration))
        nsp = _num(w.get("no_speech_prob"))
        channel = w.get("channel")
        out.append(DecodeWindow(start=start, end=round_seconds(min(max(end, start), duration)),
                                channel=channel if isinstance(channel, int) and not isinstance(channel, bool)
                                else None, temperature=_num(w.get("temperature")),
                                avg_logprob=_num(w.get("avg_logprob")),
                                compression_ratio=_num(w.get("compression_ratio")),
                                no_speech_prob=nsp if nsp is not None and 0.0 <= nsp <= 1.0 else None))
    return sorted(out, key=lambda w: (w.channel or 0, w.start)) or None


def window_of(windows: list[DecodeWindow] | None, start: float, end: float,
              channel: int | None = None) -> DecodeWindow | None:
    """The window that wrote the segment ``[start, end]`` (seconds) of ``channel``: the one it overlaps most,
    else (a zero-length segment) the one containing ``start``; ``None`` when no window of that channel
    covers it."""
    best, best_overlap = None, 0.0
    for w in windows or ():
        if w.channel != channel:
            continue
        overlap = min(end, w.end) - max(start, w.start)
        if overlap > best_overlap or (best is None and overlap == 0.0 and w.start <= start <= w.end):
            best, best_overlap = w, max(overlap, 0.0)
    return best
