"""The progress-event callback every pipeline takes."""

from __future__ import annotations

from collections.abc import Callable

EventFn = Callable[[str, dict], None]
"""``on_event(kind, payload)``: kinds ``queued``, ``started``, ``delta``, ``segment``, ``finished``."""
