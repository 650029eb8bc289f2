"""The OpenAI route sends MOSS-TD's segments as they complete (``transcript.text.segment`` before the end),
then only the stored transcript's segments it has not sent."""

from __future__ import annotations

import json

from api.routes import openai as route
from diarist.transcript import Transcript


def test_live_segments_then_the_rest(monkeypatch):
    t = Transcript.from_engine_json({"duration": 6.0, "model": "moss-td", "finish_reason": "stop", "metrics": {},
                                     "segments": [
        {"speaker": "S01", "start": 0.5, "end": 2.3, "text": "Morning."},
        {"speaker": "S02", "start": 2.9, "end": 5.0, "text": "Yes."}]})
    monkeypatch.setattr(route, "_finished", lambda services, job_id, events: (None, t))
    bus = [{"type": "delta", "text": "Morning."},
           {"type": "segment", "start": 0.5, "end": 2.3, "text": "Morning.", "speaker": "S01"},
           {"type": "segment", "start": 0.1, "end": 0.4, "text": "no speaker yet", "speaker": None},  # cascade
           {"type": "delta", "text": " Yes."},
           {"type": "status", "status": "completed"}]
    out = [json.loads(line[len("data: "):]) for line in route._stream(None, "job", iter(bus), "diarized_json")]
    assert [e["type"] for e in out] == ["transcript.text.delta", "transcript.text.segment", "transcript.text.delta",
                                        "transcript.text.segment", "transcript.text.done"]
    assert (out[1]["id"], out[1]["speaker"], out[1]["text"]) == ("seg_0", "S01", "Morning.")
    assert (out[3]["id"], out[3]["speaker"], out[3]["text"]) == ("seg_1", "S02", "Yes.")  # from the transcript
    plain = [json.loads(line[6:])["type"] for line in route._stream(None, "job", iter(bus), "json")]
    assert "transcript.text.segment" not in plain
