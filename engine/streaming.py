"""Streaming text: incremental detokenization and delta coalescing.

Byte-level BPE tokens can end inside a multi-byte UTF-8 character; decoding such a prefix yields U+FFFD.
The detokenizer holds text back until the character completes, so a client never sees a broken character.
Deltas are coalesced into windows (default 50 ms): per-token emission costs throughput at high
concurrency, while the first delta and the final flush go out at once for low latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Args:
        decode: ``ids -> str`` (special tokens skipped).
        keep: predicate on a token id; ids it rejects (e.g. Whisper timestamps, EOS) are not text.

    Invariant: the concatenation of every delta returned by :meth:`push` and :meth:`flush` equals
    ``decode(all kept ids)`` once the stream is flushed.
    """

    def __init__(self, decode: Callable[[list[int]], str], keep: Callable[[int], bool] | None = None) -> None:
        self._decode = decode
        self._keep = keep
        self._ids: list[int] = []
        self._text = ""
        # ids[prefix:read] were emitted last time; ids[:read] end on a character boundary, so decoding
        # from ``prefix`` never starts inside a character, and the short prefix gives left context.
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        """Add one token; return the new text that is safe to show (may be empty)."""
        if self._keep is not None and not self._keep(token_id):
            return ""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""  # nothing new, or an incomplete UTF-8 sequence: wait for the next token
        delta = new_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._text += delta
        return delta

    def flush(self) -> str:
        """Return whatever is left, even an incomplete character (the stream has ended)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        delta = new_text[len(prefix_text) :]
        self._prefix = self._read = len(self._ids)
        self._text += delta
        return delta

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return self._text


class DeltaCoalescer:
    """Buffers text deltas and releases them at most once per ``interval_s`` seconds.

    The first non-empty delta is released at once; :meth:`flush` releases the rest.
    """

    def __init__(self, interval_s: float = 0.05, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._buf = ""
        self._last: float | None = None

    def push(self, delta: str) -> str | None:
        """Add a delta; return coalesced text when the window has elapsed (or for the first text), else None."""
        self._buf += delta
        if not self._buf:
            return None
        now = self._clock()
        if self._last is None or now - self._last >= self.interval_s:
            out, self._buf, self._last = self._buf, "", now
            return out
        return None

    def flush(self) -> str | None:
        out, self._buf = self._buf, ""
        return out or None
