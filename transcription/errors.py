"""Errors of a transcription, all :class:`diarist.contract.errors.CodedError`.

A module of its own so that each model family's pipeline (``transcription.whisper`` for Whisper,
``transcription.moss_td`` for MOSS-TD) raises the same classes without importing the other.
"""

from __future__ import annotations

from diarist.contract.errors import CodedError
from engine.request import RequestRejected


class EngineError(CodedError, RuntimeError):
    """A sequence of this transcription failed inside the engine (code ``engine_error``, 500, retryable: the
    next attempt may land on a healthy engine)."""

    status = 500
    retryable = True

    def __init__(self, message: str) -> None:
        super().__init__("engine_error", message)


class Rejected(CodedError, RequestRejected):
    """A request this engine can never run as asked (422): the engine's own refusals (``too_short``,
    ``too_long``, ``kv_capacity``; :class:`engine.request.RequestRejected`, which this class also is, so
    ``except RequestRejected`` still catches it) and the pipeline's (``unsupported_language``,
    ``unsupported_task``, the Whisper cascade's ``too_long``)."""

    status = 422

    @classmethod
    def of(cls, error: RequestRejected) -> Rejected:
        """``error`` (the engine's refusal) as a coded error, with its code and message."""
        return cls(error.code, error.message)
