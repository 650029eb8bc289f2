"""From overlapping segmentation chunks to one frame grid: averaged local activity, speech, speaker count.

All chunks start on multiples of the model's frame step (``segmentation.chunk_offsets``), so frame ``f``
of a chunk starting at frame ``o`` is global frame ``o + f`` and aggregation is plain indexing. A frame
that several chunks see gets the mean of their values (pyannote aggregates the same way, without its
optional Hamming weighting).
"""

from __future__ import annotations

import numpy as np

from transcription.audio import SAMPLE_RATE
from transcription.audio.segmentation import FRAME_STEP, frame_centres


def grid_size(num_samples: int, offsets: np.ndarray, frames_per_chunk: int) -> int:
    """Global frames (from 0) whose centre lies inside the recording (``num_samples`` samples)."""
    centres = frame_centres(np.arange(max(0, int(offsets[-1]) + frames_per_chunk)))
    return int((centres < num_samples / SAMPLE_RATE).sum())


def frame_edges(num: int) -> np.ndarray:
    """float64 ``[num + 1]``: global frame ``j`` spans ``[edges[j], edges[j + 1])`` seconds (frames are
    ``FRAME_STEP`` samples apart; each owns the step around its centre)."""
    centres = frame_centres(np.arange(num + 1))
    return np.r_[0.0, centres[:-1] + FRAME_STEP / SAMPLE_RATE / 2]


def aggregate(offsets: np.ndarray, values: np.ndarray, num: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean over chunks of per-chunk frame values.

    Args:
        offsets: int ``[C]`` chunk starts in frames (may be negative: padding before the recording).
        values: float ``[C, F, ...]`` per-chunk frame values.
        num: size of the global grid (frames outside ``[0, num)`` are dropped).
    Returns:
        ``(mean [num, ...], coverage [num])``: the mean over the chunks that see each frame (0 where
        none does) and how many chunks see it.
    """
    total = np.zeros((num,) + values.shape[2:], np.float64)
    count = np.zeros(num, np.int64)
    for o, v in zip(offsets, values, strict=True):
        a, b = max(0, int(o)), min(num, int(o) + v.shape[0])
        if b > a:
            total[a:b] += v[a - o : b - o]
            count[a:b] += 1
    shape = (num,) + (1,) * (values.ndim - 2)
    return total / np.maximum(count, 1).reshape(shape), count


def runs(mask: np.ndarray, edges: np.ndarray) -> list[tuple[float, float]]:
    """``(start, end)`` seconds of each run of True frames in a bool ``[frames]`` mask."""
    d = np.diff(np.r_[0, mask.astype(np.int8), 0])
    return [(float(edges[a]), float(edges[b])) for a, b in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1),
                                                                strict=True)]


def clean_up(regions: list[tuple[float, float]], min_speech_s: float, min_silence_s: float, pad_s: float,
             duration: float) -> list[tuple[float, float]]:
    """Speech regions with gaps shorter than ``min_silence_s`` bridged, regions shorter than
    ``min_speech_s`` dropped, and ``pad_s`` added on both sides (never past a neighbour or the
    recording), in the same spirit as Silero's post-processing (``transcription.audio.vad``)."""
    merged: list[list[float]] = []
    for s, e in sorted(regions):
        if merged and s - merged[-1][1] < min_silence_s:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    kept = [(s, e) for s, e in merged if e - s >= min_speech_s]
    out = []
    for i, (s, e) in enumerate(kept):
        lo = max(0.0, s - pad_s, (kept[i - 1][1] + s) / 2 if i else 0.0)
        hi = min(duration, e + pad_s, (e + kept[i + 1][0]) / 2 if i + 1 < len(kept) else duration)
        out.append((lo, hi))
    return out
