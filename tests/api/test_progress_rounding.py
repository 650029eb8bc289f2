"""A job's ``progress`` is served rounded to PROGRESS_DECIMALS (3): job objects and live events alike."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace

from api.routes.events import job_events
from api.schemas import JobOut


def test_job_objects_serve_progress_to_three_decimals():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    job = JobOut(id="job_1", status="processing", created_at=now, updated_at=now, model="whisper",
                 queue="transcribe.short", progress=1 / 3)
    assert json.loads(job.model_dump_json())["progress"] == 0.333  # what FastAPI sends
    assert job.model_dump(mode="json")["progress"] == 0.333
    assert job.progress == 1 / 3  # the value itself is untouched: only the wire form is rounded


class Bus:
    """A subscription that hands out ``events`` in order."""

    def __init__(self, events: list[dict]) -> None:
        self.events = events

    def get(self, timeout: float) -> dict | None:
        return self.events.pop(0) if self.events else None


def test_events_serve_progress_to_three_decimals():
    job = SimpleNamespace(id="job_1", status="processing", progress=2 / 3, error_code=None, error_message=None)
    sub = Bus([{"type": "progress", "progress": 0.123456},
               {"type": "segment", "start": 1.23456, "end": 2.0, "text": "hi"},
               {"type": "status", "status": "completed", "progress": 1.0}])
    events = list(job_events(services=None, job=job, sub=sub))
    assert [e.get("progress") for e in events] == [0.667, 0.123, None, 1.0]
    assert events[2]["start"] == 1.235  # the times are still rounded too
