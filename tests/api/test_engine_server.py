"""The engine server's routes, in-process over the session engine (the worker's side is HttpEngineClient)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from tests.conftest import data_file
from worker.engine_client import HttpEngineClient, JobFailure

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_client(stack):
    from api.engine_server import create_engine_app

    # The stack keeps the session engine's loop running for the whole module.
    with TestClient(create_engine_app(stack.engine, engine_id="test-engine")) as c:
        yield c


def test_health_and_stats(engine_client):
    assert engine_client.get("/health").json() == {"status": "ok", "engine_id": "test-engine"}
    stats = engine_client.get("/stats").json()
    assert stats["engine_id"] == "test-engine" and stats["kv_tokens_total"] > 0


def test_internal_stream_ends_with_the_result(engine_client):
    body = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
    with engine_client.stream("POST", "/internal/transcribe", params={"options": json.dumps({"num_speakers": 1})},
                              content=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.iter_lines() if x]
    kinds = [x["type"] for x in lines]
    assert kinds[-1] == "result" and "delta" in kinds and "segment" in kinds
    result = lines[-1]["result"]
    assert result["engine_id"] == "test-engine" and result["duration"] == pytest.approx(11.0, abs=0.01)
    assert "ask not" in " ".join(s["text"] for s in result["segments"]).lower()


def test_internal_stream_reports_bad_audio_as_a_code(engine_client):
    with engine_client.stream("POST", "/internal/transcribe", content=b"not audio at all") as r:
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[-1]["type"] == "error" and lines[-1]["code"] == "decode_failed"


def test_openai_route_on_the_engine(engine_client):
    with data_file("en_jfk_inaugural/jfk.flac").open("rb") as f:
        r = engine_client.post("/v1/audio/transcriptions", files={"file": ("jfk.flac", f)},
                               data={"model": "whisper", "response_format": "text"})
    assert r.status_code == 200 and "ask not" in r.text.lower()


def test_http_client_maps_a_dead_server_to_an_engine_outage(tmp_path):
    """Nothing listening: the engine is down, not the job at fault (waited out, no attempt spent)."""
    from diarist.outages import Dependency

    f = tmp_path / "a.wav"
    f.write_bytes(b"x")
    with pytest.raises(JobFailure) as e:
        HttpEngineClient("http://127.0.0.1:9", timeout_s=2).transcribe(f, {})
    assert (e.value.code, e.value.retryable, e.value.outage) == ("engine_unavailable", True, Dependency.ENGINE)
    assert not HttpEngineClient("http://127.0.0.1:9").ready()


def test_worker_process_never_imports_torch():
    """Workers are thin: importing the tasks (what `diarist worker` does) must not load torch/CUDA."""
    code = "import sys, worker.tasks, worker.engine_client, diarist.commands.worker; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
