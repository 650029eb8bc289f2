"""Packing speech regions into decoder windows of at most 30 s."""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.mel import CHUNK_SAMPLES, SAMPLE_RATE

MAX_WINDOW_S = CHUNK_SAMPLES / SAMPLE_RATE
"""The Whisper encoder's window (30 s): the longest speech a decoder window may hold."""


@dataclass(frozen=True)
class Window:
    """A contiguous slice ``[start, end)`` of the recording, in seconds, decoded as one sequence."""

    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def pack_windows(speech: list[tuple[float, float]], max_s: float = MAX_WINDOW_S) -> list[Window]:
    """Greedily pack sorted speech regions (seconds) into windows no longer than ``max_s``.

    A window starts at a region's start and takes following regions while the window stays within
    ``max_s``; silence between packed regions stays inside the window (Whisper handles pauses and the
    timestamps stay true). A region longer than ``max_s`` is cut into ``max_s`` pieces.
    """
    out: list[Window] = []
    cur: list[float] | None = None
    for s, e in sorted(speech):
        if e <= s:
            continue
        while e - s > max_s:
            if cur is not None:
                out.append(Window(*cur))
                cur = None
            out.append(Window(s, s + max_s))
            s += max_s
        if cur is not None and e - cur[0] <= max_s:
            cur[1] = max(cur[1], e)
        else:
            if cur is not None:
                out.append(Window(*cur))
            cur = [s, e]
    if cur is not None:
        out.append(Window(*cur))
    return out
