"""Errors of a transcription, beside the engine's :class:`engine.request.RequestRejected`.

A module of its own so that each model family's pipeline (``transcriber`` for Whisper,
``moss_transcribe`` for MOSS-TD) raises the same class without importing the other.
"""

from __future__ import annotations


class EngineError(RuntimeError):
    """A sequence of this transcription failed inside the engine (code ``engine_error``)."""

    code = "engine_error"
