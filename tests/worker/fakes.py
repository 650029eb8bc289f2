"""Engine stand-ins for worker tests (no model): results in the engine's own result shape."""

from __future__ import annotations

from diarist.contract.result import TranscriptionResult


def engine_result(text: str = "hello world", duration: float = 1.0) -> dict:
    """A minimal engine result in its JSON form (what the engine server's ``result`` line carries)."""
    return {"duration": duration, "language": "en", "model": "whisper", "finish_reason": "stop", "coverage": 1.0,
            "segments": [{"speaker": "S01", "start": 0.0, "end": duration, "text": text}],
            "metrics": {"processing_s": 0.1, "rtf": 0.1}}


def typed_result(text: str = "hello world", duration: float = 1.0) -> TranscriptionResult:
    """:func:`engine_result` as the engine clients return it."""
    return TranscriptionResult.from_json(engine_result(text, duration))


class ResultEngine:
    """Answers every request with :func:`engine_result` after one segment event."""

    engine_id = "fake-engine"

    def __init__(self, text: str = "hello world") -> None:
        self.text, self.calls = text, 0

    def transcribe(self, audio, options, on_event=None, cancel=None) -> TranscriptionResult:
        self.calls += 1
        if on_event is not None:
            on_event("segment", {"start": 0.0, "end": 0.5, "text": self.text})
        return typed_result(self.text)

    def ready(self) -> bool:
        return True
