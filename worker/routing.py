"""Queue names and routing by audio duration (duration classes, docs/service.md)."""

from __future__ import annotations

SHORT = "transcribe.short"
LONG = "transcribe.long"
WEBHOOKS = "webhooks"
QUEUES = (SHORT, LONG, WEBHOOKS)
CLASSES = {"short": SHORT, "long": LONG, "webhooks": WEBHOOKS}


def queue_for(duration_s: float | None, threshold_s: float) -> str:
    """``transcribe.long`` for audio of at least ``threshold_s`` seconds, else ``transcribe.short``.

    An unknown duration (``None``) goes to the long queue: it could be anything.
    """
    if duration_s is None or duration_s >= threshold_s:
        return LONG
    return SHORT


def admission_class(queue: str) -> str:
    """The engine admission class of a job on ``queue``: ``short`` / ``long`` for the transcription queues
    (their names in :data:`CLASSES`), ``default`` for anything else.

    The engine admits each class against its own limit, so the two classes keep separate admission on one
    engine; the value travels with the job's request (``Sequence.admission_class``).
    """
    return next((name for name, q in CLASSES.items() if q == queue and q in (SHORT, LONG)), "default")
