"""``GET /v1/jobs/{id}/events``: what the stream serves of the bus events."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.queue_only import WAV, services


@pytest.fixture
def svc(tmp_path):
    s = services(tmp_path)
    yield s
    s.close()


def test_event_stream_times_are_rounded_to_the_millisecond(svc):
    """A segment event's float noise (12.340000000001) is served as 12.34 by GET /v1/jobs/{id}/events (and
    by the OpenAI stream, which reads the same events)."""
    import json

    from api.app import create_app
    from diarist import jobs

    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        job_id = c.post("/v1/jobs", files={"file": ("call.wav", WAV.read_bytes())}).json()["id"]
        with c.stream("GET", f"/v1/jobs/{job_id}/events") as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # the current status: subscribed
            svc.bus.publish(job_id, {"type": "segment", "start": 12.340000000001, "end": 13.9996, "text": "hi",
                                     "speaker": None})
            jobs.cancel(svc, job_id)  # the final status ends the stream
            data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert data[0] == {"start": 12.34, "end": 14.0, "text": "hi", "speaker": None}
    assert data[-1]["status"] == "canceled"
