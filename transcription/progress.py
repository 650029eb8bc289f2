"""The progress-event callback every pipeline takes."""

from __future__ import annotations

from collections.abc import Callable

from diarist.contract.events import STAGES

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
