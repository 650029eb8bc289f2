"""One voice vector per speaker: the CAM++ centroid of a speaker's speech, for known-speaker identification.

The speaker cascade labels speakers within one recording; naming them across recordings needs a vector per
speaker that can be compared with an enrolled voice profile (``diarist.speakers``). Both sides are made here
the same way, from the final labels, so that any model family gets them (the Whisper cascade's turns, or
MOSS-TD's own segments):

- :func:`speaker_embeddings`: each speaker's spans (turns, else segments), cut to where nobody else talks
  (all of its spans when that leaves less than ``MIN_SOLO_S``), cut into windows of at most ``WINDOW_S``,
  the longest first up to ``MAX_SPEECH_S`` seconds; each window is embedded with the cascade's embedder and
  the duration-weighted mean is L2-normalised (the usual d-vector / x-vector centroid).
- :func:`sample_embedding`: an enrollment sample's speech regions (``detect_speech``), embedded the same way.

Every vector is tagged with :func:`model_id` (the embedder and its weights' hash), so a vector is never
compared with one made by other weights.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from diarist.contract.result import SpeakerEmbedding
from transcription.audio import SAMPLE_RATE
from transcription.cancel import ShouldCancel, check
from transcription.diarization.embedders import default_embedder

WINDOW_S = 10.0
"""Longest window embedded at once (seconds): longer spans are cut into windows of at most this length."""
MIN_WINDOW_S = 0.5
"""Shorter pieces of speech are not embedded (too short for a stable CAM++ vector)."""
MIN_SOLO_S = 1.0
"""Solo speech a speaker needs for its vector to be made of solo speech only (seconds); below it, all of
its spans are used, overlapped ones included."""
MAX_SPEECH_S = 60.0
"""Most speech embedded per speaker (seconds): the centroid is stable well before that, and it bounds the
cost on long recordings."""

Span = tuple[float, float]


@functools.cache
def _weights_version(name: str) -> str:
    if name != "campplus":
        return "1"
    from transcription.diarization.campplus import weights_path

    return hashlib.sha256(weights_path().read_bytes()).hexdigest()[:12]


def model_id(embedder: Any) -> str:
    """``<embedder name>@<version>``: ``campplus@<first 12 hex of the weights' SHA-256>`` for CAM++."""
    return f"{embedder.name}@{_weights_version(embedder.name)}"


def _subtract(spans: list[Span], others: list[Span]) -> list[Span]:
    """``spans`` less every instant covered by ``others`` (seconds; both lists of ``(start, end)``)."""
    out = []
    for s, e in spans:
        pieces = [(s, e)]
        for a, b in others:
            if b <= s or a >= e:
                continue
            pieces = [p for x, y in pieces for p in ((x, min(y, a)), (max(x, b), y)) if p[1] - p[0] > 1e-6]
        out.extend(pieces)
    return out


def _windows(spans: Iterable[Span]) -> list[Span]:
    """Spans cut into windows of at most ``WINDOW_S`` (none shorter than ``MIN_WINDOW_S``), longest first,
    up to ``MAX_SPEECH_S`` seconds in all."""
    wins: list[Span] = []
    for s, e in spans:
        n = int(np.ceil((e - s) / WINDOW_S - 1e-9)) if e > s else 0
        for i in range(n):
            a, b = s + i * (e - s) / n, s + (i + 1) * (e - s) / n
            if b - a >= MIN_WINDOW_S:
                wins.append((a, b))
    wins.sort(key=lambda w: w[0] - w[1])
    out, total = [], 0.0
    for w in wins:
        if total >= MAX_SPEECH_S:
            break
        out.append(w)
        total += w[1] - w[0]
    return out


def _centroid(wave: np.ndarray, windows: list[Span], embedder: Any, should_cancel: ShouldCancel) -> np.ndarray:
    """Duration-weighted mean of the windows' embeddings, unit length: float32 ``[d]``."""
    emb = embedder.embed(wave, windows, should_cancel=should_cancel) if embedder.name == "campplus" else \
        embedder.embed(wave, windows)
    w = np.array([b - a for a, b in windows], np.float32)
    c = (emb * w[:, None]).sum(0)
    return (c / max(float(np.linalg.norm(c)), 1e-12)).astype(np.float32)


def speaker_embeddings(wave: np.ndarray, spans: dict[Any, list[Span]], embedder: Any = None, device: str = "cpu",
                       should_cancel: ShouldCancel = None) -> list[SpeakerEmbedding]:
    """One voice vector per speaker of a recording.

    Args:
        wave: float32 ``[n]`` mono PCM at 16 kHz.
        spans: speaker label -> its ``(start, end)`` spans in seconds (the diarization's turns, or segments).
        embedder: default the process's CAM++ (``default_embedder(device)``).
        device: where the default embedder runs.
        should_cancel: polled before each speaker.
    Returns:
        :class:`SpeakerEmbedding` per speaker that has at least ``MIN_WINDOW_S`` of speech, in ``spans``
        order; ``speech_s`` is the speech embedded (at most ``MAX_SPEECH_S``).
    Raises:
        Canceled: ``should_cancel()`` returned True.
    """
    wave = np.asarray(wave, np.float32).reshape(-1)
    duration = wave.size / SAMPLE_RATE
    clipped = {k: [(max(0.0, s), min(duration, e)) for s, e in v if e > s] for k, v in spans.items()}
    out: list[SpeakerEmbedding] = []
    for spk, own in clipped.items():
        check(should_cancel)
        others = [x for k, v in clipped.items() if k != spk for x in v]
        solo = _subtract(own, others)
        windows = _windows(solo if sum(e - s for s, e in _windows(solo)) >= MIN_SOLO_S else own)
        if not windows:
            continue
        embedder = embedder or default_embedder(device)
        vec = _centroid(wave, windows, embedder, should_cancel)
        out.append(SpeakerEmbedding(spk, [float(x) for x in vec], model_id(embedder),
                                    round(sum(b - a for a, b in windows), 3)))
    return out


def result_spans(result: dict[str, Any], duration: float) -> dict[Any, list[Span]]:
    """Speaker -> spans of a pipeline result (its JSON form): the diarization's ``turns`` when it has them,
    else the segments' (MOSS-TD labels speakers in its segments only); speakers in first-appearance order.

    An unterminated segment (``end`` ``None``: MOSS-TD's last one, cut by the budget) runs to the next
    segment's start, else to ``duration`` (seconds), as ``diarist.transcript`` closes it. Items without a
    speaker or a start are left out.
    """
    items = sorted((x for x in (result.get("turns") or result.get("segments") or []) if x.get("start") is not None),
                   key=lambda x: x["start"])
    spans: dict[Any, list[Span]] = {}
    for i, x in enumerate(items):
        if x.get("speaker") is None:
            continue
        end = x.get("end")
        if end is None:
            end = items[i + 1]["start"] if i + 1 < len(items) else duration
        spans.setdefault(x["speaker"], []).append((float(x["start"]), float(end)))
    return spans


def sample_embedding(wave: np.ndarray, embedder: Any = None, device: str = "cpu",
                     should_cancel: ShouldCancel = None) -> SpeakerEmbedding | None:
    """The voice vector of an enrollment sample (one talker): its detected speech, embedded as above.

    Args:
        wave: float32 ``[n]`` mono PCM at 16 kHz.
    Returns:
        A :class:`SpeakerEmbedding` (``speaker`` ``None``; ``speech_s``: the speech detected, which may be
        more than was embedded), or ``None`` when the sample holds less than ``MIN_WINDOW_S`` of speech.
    """
    from transcription.audio.vad import detect_speech

    wave = np.asarray(wave, np.float32).reshape(-1)
    regions = detect_speech(wave, device=device, should_cancel=should_cancel)
    speech_s = sum(e - s for s, e in regions)
    got = speaker_embeddings(wave, {None: regions}, embedder, device, should_cancel)
    if not got:
        return None
    got[0].speech_s = round(speech_s, 3)
    return got[0]
