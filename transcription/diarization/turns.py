"""Speaker turns: the output type of diarization, and turns from per-frame speaker activity."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Turn:
    """One speaker's stretch of speech: ``start``/``end`` in seconds, ``speaker`` an index 0, 1, ...
    numbered by first appearance."""

    start: float
    end: float
    speaker: int


def number_by_appearance(turns: list[Turn]) -> list[Turn]:
    """Sort turns by (start, end) and renumber speakers 0, 1, ... in order of first appearance (in place)."""
    turns.sort(key=lambda t: (t.start, t.end, t.speaker))
    order: dict[int, int] = {}
    for t in turns:
        t.speaker = order.setdefault(t.speaker, len(order))
    return turns


def activity_to_turns(active: np.ndarray, edges: np.ndarray) -> list[Turn]:
    """Turns from a frame grid of speaker activity.

    Args:
        active: bool ``[frames, speakers]``; several speakers may be active in one frame (overlap).
        edges: float ``[frames + 1]``, frame ``j`` spans ``[edges[j], edges[j + 1])`` seconds.
    Returns:
        One turn per run of consecutive active frames of a speaker, numbered by first appearance and
        sorted by start; turns of different speakers may overlap.
    """
    turns: list[Turn] = []
    for spk in range(active.shape[1]):
        d = np.diff(np.r_[0, active[:, spk].astype(np.int8), 0])
        for a, b in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1), strict=True):
            turns.append(Turn(round(float(edges[a]), 3), round(float(edges[b]), 3), spk))
    return number_by_appearance(turns)
