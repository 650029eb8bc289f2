"""Ordered, coalesced progress events for a transcription made of several concurrent windows."""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.streaming import DeltaCoalescer

EventFn = Callable[[str, dict], None]
"""``on_event(kind, payload)``: kinds ``queued``, ``started``, ``delta``, ``segment``, ``finished``."""


class WindowProgress:
    """Merges the events of a recording's windows, which decode concurrently, into one ordered stream.

    Text deltas of window ``k`` are held until windows ``< k`` have finished, so clients read the
    transcript in time order; deltas pass through one :class:`DeltaCoalescer`; a window's segments are
    emitted when it and every earlier window are done.
    """

    def __init__(self, n: int, on_event: EventFn | None, interval_s: float) -> None:
        self.on_event = on_event
        self.n = n
        self.next_window = 0
        self.pending: dict[int, str] = {}
        self.done: set[int] = set()
        self.started = False
        self.lock = threading.Lock()
        self.coalescer = DeltaCoalescer(interval_s)
        self.cond = threading.Condition(self.lock)

    def emit(self, kind: str, payload: dict) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)

    def text(self, index: int, delta: str) -> None:
        with self.lock:
            if not self.started:
                self.started = True
                self.emit("started", {})
            if index != self.next_window:
                self.pending[index] = self.pending.get(index, "") + delta
                return
            out = self.coalescer.push(delta)
            if out:
                self.emit("delta", {"text": out})

    def window_done(self, index: int, segments: list[dict]) -> None:
        with self.cond:
            self.done.add(index)
            self.pending.setdefault(index, "")
            self.pending[index] = segments  # type: ignore[assignment]
            while self.next_window in self.done:
                segs = self.pending.pop(self.next_window)
                for seg in segs:
                    self.emit("segment", {"start": seg["start"], "end": seg["end"], "text": seg["text"]})
                self.next_window += 1
                buffered = self.pending.get(self.next_window)
                if isinstance(buffered, str) and buffered:
                    self.pending[self.next_window] = ""
                    out = self.coalescer.push(buffered)
                    if out:
                        self.emit("delta", {"text": out})
            if self.next_window >= self.n:
                rest = self.coalescer.flush()
                if rest:
                    self.emit("delta", {"text": rest})
            self.cond.notify_all()
