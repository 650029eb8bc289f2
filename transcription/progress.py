"""Ordered, coalesced progress events for a transcription made of several concurrent windows."""

from __future__ import annotations

import threading
from collections.abc import Callable

from diarist.contract.events import STAGES
from engine.streaming import DeltaCoalescer

EventFn = Callable[[str, dict], None]
"""``on_event(kind, payload)``: kinds ``stage``, ``queued``, ``started``, ``delta``, ``segment``, ``finished``
(:mod:`diarist.contract.events`)."""


def begin_stage(on_event: EventFn | None, stage: str) -> None:
    """Tell ``on_event`` (if any) that ``stage`` begins: one of :data:`diarist.contract.events.STAGES`
    (``ValueError`` for another name: a typo would otherwise reach clients as a protocol error)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (known: {', '.join(STAGES)})")
    if on_event is not None:
        on_event("stage", {"stage": stage})


class WindowProgress:
    """Merges the events of a recording's windows, which decode concurrently, into one ordered stream.

    Text deltas of window ``k`` are held until windows ``< k`` have finished, so clients read the
    transcript in time order; deltas pass through one :class:`DeltaCoalescer`; a window's segments are
    emitted when it and every earlier window are done.
    """

    def __init__(self, n: int, on_event: EventFn | None, interval_s: float) -> None:
        self.on_event = on_event
        self.n = n
        self.next_window = 0  # the window whose text is streamed live; earlier ones are all done
        self.held_text: dict[int, str] = {}  # text of later windows, held until their turn
        self.segments: dict[int, list[dict]] = {}  # finished windows not yet emitted
        self.started = False
        self.lock = threading.Lock()
        self.coalescer = DeltaCoalescer(interval_s)

    def emit(self, kind: str, payload: dict) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)

    def _push(self, text: str) -> None:
        out = self.coalescer.push(text)
        if out:
            self.emit("delta", {"text": out})

    def text(self, index: int, delta: str) -> None:
        with self.lock:
            if not self.started:
                self.started = True
                self.emit("started", {})
            if index == self.next_window:
                self._push(delta)
            else:
                self.held_text[index] = self.held_text.get(index, "") + delta

    def window_done(self, index: int, segments: list[dict]) -> None:
        with self.lock:
            self.segments[index] = segments
            while self.next_window in self.segments:
                for seg in self.segments.pop(self.next_window):
                    self.emit("segment", {"start": seg["start"], "end": seg["end"], "text": seg["text"]})
                self.next_window += 1
                held = self.held_text.pop(self.next_window, "")
                if held:
                    self._push(held)
            if self.next_window >= self.n:
                rest = self.coalescer.flush()
                if rest:
                    self.emit("delta", {"text": rest})
