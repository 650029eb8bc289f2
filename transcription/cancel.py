"""Stopping a transcription part-way: the ``should_cancel`` callable every stage polls, and the exception
a stage raises when it stops (the transcriber turns it into finish_reason ``abort``)."""

from __future__ import annotations

from collections.abc import Callable

ShouldCancel = Callable[[], bool] | None
"""A callable that returns True once the caller no longer wants the result (None: never canceled)."""


class Canceled(Exception):
    """Raised by a stage that stopped because ``should_cancel()`` returned True."""


def check(should_cancel: ShouldCancel) -> None:
    """Raise :class:`Canceled` when ``should_cancel`` says so; a no-op for None."""
    if should_cancel is not None and should_cancel():
        raise Canceled
