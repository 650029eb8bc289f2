"""Fallback diarization without a segmentation model: sliding-window embeddings ▸ clustering ▸ frame
labels ▸ turns. Used when ``segmentation-3.0`` is unavailable or another embedder is asked for, and when
the segmentation pipeline's turns hold fewer speakers than a hint or its own evidence asks for
(``pipeline.diarize``, step 5); measured against the default in docs/diarization.md.

Windows of ``WINDOW_S`` seconds every ``HOP_S`` seconds tile each speech region (a region shorter than
one window gets one window, widened to ``WINDOW_S`` around its centre where the recording allows, so
every embedding sees the same amount of audio). Each 10 ms frame of speech takes the speaker of the
window whose centre is nearest; runs of one speaker become turns.

Overlapped speech (a deliberate choice): every instant is given to exactly one speaker, the dominant
one of the nearest window. Turns never overlap, so each word of a transcript has one speaker. In an
overlap the quieter talker is missed (it counts as missed speech in DER); we accept that because
Whisper itself writes one stream of words, and a second, overlapping label would have no words to
carry. Multichannel recordings with one talker per channel keep both talkers (``channels.py``).
"""

from __future__ import annotations

import numpy as np

from transcription.audio import SAMPLE_RATE
from transcription.diarization.cluster import cluster_embeddings
from transcription.diarization.embedders import default_embedder
from transcription.diarization.turns import Turn, number_by_appearance

WINDOW_S = 1.5
"""Embedding window (seconds): long enough for a stable embedding, short enough to follow turns."""
HOP_S = 0.375
"""Window hop (seconds): a quarter window, so speaker changes are placed to within ~0.2 s."""
FRAME_S = 0.01
"""Resolution of the speaker labels (seconds)."""
MIN_REGION_S = 0.1
"""Speech regions shorter than this are ignored (too short to hold a word)."""

MAX_CLUSTERED = 4000
"""Most windows the dendrogram is built from (average linkage keeps all ``n (n - 1) / 2`` distances: 4000
windows = 64 MB, about 25 minutes of continuous speech); beyond it an evenly spaced subset is clustered
and every other window takes the nearest cluster centroid (cosine), so memory stays bounded at any
length."""

THRESHOLDS = {"campplus": 0.6, "ge2e": 0.3}
"""Cosine-distance cut of the average-linkage dendrogram, per embedding model (docs/diarization.md)."""


def make_windows(speech: list[tuple[float, float]], duration: float) -> list[tuple[float, float]]:
    """Embedding windows ``(start, end)`` in seconds covering ``speech`` (see module docstring)."""
    out: list[tuple[float, float]] = []
    for s, e in speech:
        if e - s < MIN_REGION_S:
            continue
        if e - s <= WINDOW_S:
            c = (s + e) / 2
            lo = max(0.0, min(c - WINDOW_S / 2, duration - WINDOW_S))
            out.append((lo, min(duration, lo + WINDOW_S)))
            continue
        n = int(np.ceil((e - s - WINDOW_S) / HOP_S)) + 1
        starts = np.linspace(s, e - WINDOW_S, n)  # spread evenly so the last window ends at the region end
        out.extend((float(a), float(a) + WINDOW_S) for a in starts)
    return out


def _turns(speech: list[tuple[float, float]], windows: list[tuple[float, float]], labels: np.ndarray) -> list[Turn]:
    centres = np.array([(a + b) / 2 for a, b in windows])
    turns: list[Turn] = []
    for s, e in speech:
        if e - s < MIN_REGION_S:
            continue
        t = np.arange(s, e, FRAME_S) + FRAME_S / 2
        lab = labels[np.abs(t[:, None] - centres[None, :]).argmin(1)]
        cut = np.flatnonzero(np.diff(lab)) + 1
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(t)], strict=True):
            start, end = (s if a == 0 else s + a * FRAME_S), (e if b == len(t) else s + b * FRAME_S)
            spk = int(lab[a])
            if turns and turns[-1].speaker == spk and start - turns[-1].end < 1e-6:
                turns[-1].end = round(float(end), 3)
            else:
                turns.append(Turn(round(float(start), 3), round(float(end), 3), spk))
    return number_by_appearance(turns)


def diarize_windows(wave: np.ndarray, speech: list[tuple[float, float]], num_speakers: int | None = None,
            min_speakers: int | None = None, max_speakers: int | None = None, embedder=None,
            threshold: float | None = None, should_cancel=None) -> list[Turn]:
    """Who speaks when, within the given speech regions, from fixed windows (one speaker per instant).

    Args:
        wave: float32 ``[n]`` mono PCM at 16 kHz.
        speech: speech regions ``(start, end)`` in seconds, sorted and disjoint (``detect_speech``).
        num_speakers: exact speaker count; min_speakers / max_speakers: bounds on the automatic count.
        embedder: an object with ``name`` and ``embed(wave, windows) -> [n, d]`` (default CAM++).
        threshold: clustering cut (cosine distance); default ``THRESHOLDS[embedder.name]``.
        should_cancel: passed to the embedder (CAM++ polls it between batches); ``None`` for embedders
            that take none (GE2E).
    Returns:
        Non-overlapping turns sorted by start, inside the speech regions; speakers ``0..k-1`` numbered by
        first appearance. ``[]`` when there is no speech.
    Raises:
        ValueError: inconsistent speaker-count hints.
        Canceled: ``should_cancel()`` returned True while embedding.
    """
    wave = np.asarray(wave, dtype=np.float32).reshape(-1)
    duration = wave.size / SAMPLE_RATE
    speech = [(max(0.0, float(s)), min(duration, float(e))) for s, e in speech]
    speech = [(s, e) for s, e in speech if e - s >= MIN_REGION_S]
    windows = make_windows(speech, duration)
    if not windows:
        return []
    embedder = embedder or default_embedder()
    emb = (embedder.embed(wave, windows) if should_cancel is None
           else embedder.embed(wave, windows, should_cancel=should_cancel))
    weight = np.full(len(windows), HOP_S)
    thr = THRESHOLDS.get(embedder.name, 0.5) if threshold is None else threshold
    labels = _cluster_bounded(emb, weight, thr, num_speakers, min_speakers, max_speakers)
    return _turns(speech, windows, labels)


def _cluster_bounded(emb, weight, threshold, num_speakers, min_speakers, max_speakers) -> np.ndarray:
    """``cluster_embeddings`` on at most ``MAX_CLUSTERED`` windows; the others join the nearest centroid."""
    if len(emb) <= MAX_CLUSTERED:
        return cluster_embeddings(emb, threshold, num_speakers, min_speakers, max_speakers, weight=weight)
    rows = np.unique(np.linspace(0, len(emb) - 1, MAX_CLUSTERED).round().astype(int))
    scale = len(emb) / len(rows)  # each clustered window stands for this many, for ``min_cluster_s``
    sub = cluster_embeddings(emb[rows], threshold, num_speakers, min_speakers, max_speakers,
                             weight=weight[rows] * scale)
    cent = np.stack([emb[rows][sub == g].mean(0) for g in range(sub.max() + 1)])
    labels = np.argmax(emb @ cent.T, axis=1)
    labels[rows] = sub  # the clustered windows keep their own cluster
    return labels
