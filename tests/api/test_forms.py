"""A second file in one upload is 422 ``multiple_files`` (``api/forms.py``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.queue_only import WAV, rows, services


@pytest.fixture
def svc(tmp_path):
    s = services(tmp_path, sync_timeout_s=3)  # a job wrongly accepted fails the test, never hangs it
    yield s
    s.close()


def test_two_files_in_one_request_are_refused_with_multiple_files(svc):
    """Both upload routes: 422 ``multiple_files`` (not Starlette's 400 ``bad_request``, nor one of the
    files transcribed silently), and no job."""
    from api.app import create_app

    audio = WAV.read_bytes()
    two = [("file", ("a.wav", audio)), ("file", ("b.wav", audio))]
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        jobs = c.post("/v1/jobs", files=two)
        extra = c.post("/v1/jobs", files=[("file", ("a.wav", audio)), ("notes", ("n.txt", b"x"))])
        oai = c.post("/v1/audio/transcriptions", data={"model": "whisper-1"}, files=two)
    for r in (jobs, extra, oai):
        assert r.status_code == 422 and r.json()["error"]["code"] == "multiple_files", r.text
        assert "one recording per request" in r.json()["error"]["message"]
    assert "'a.wav', 'b.wav'" in oai.json()["error"]["message"]
    assert rows(svc) == [] and svc.dispatcher.sent == []
