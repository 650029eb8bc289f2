"""The engine server's routes, in-process over the session engine (the worker's side is HttpEngineClient)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from diarist.contract.options import TranscribeOptions
from engine_server.client import HttpEngineClient, JobFailure
from tests.conftest import data_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_client(stack):
    from engine_server.server import create_engine_app

    # The stack keeps the session engine's loop running for the whole module; the served names are the
    # stack's settings', as ``diarist engine`` passes them.
    app = create_engine_app(stack.engine, engine_id="test-engine",
                            served_models=stack.services.settings.served_model_names)
    with TestClient(app) as c:
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


def test_openai_route_on_the_engine_honours_temperature_and_timestamp_granularities(engine_client):
    """As the main API's route (issue 33 items 7, 20): nothing of either is accepted and ignored."""
    from transcription.decode_quality import temperature_schedule

    body = data_file("en_jfk_inaugural/jfk.flac").read_bytes()

    def post(**data):
        return engine_client.post("/v1/audio/transcriptions", files={"file": ("jfk.flac", body)},
                                  data={"model": "whisper", "response_format": "verbose_json", **data})

    r = post(**{"timestamp_granularities[]": "word", "temperature": "0.4"})
    assert r.status_code == 200 and "segments" not in r.json() and r.json()["words"]
    r = post(**{"timestamp_granularities[]": "segment", "temperature": "0.4"})
    assert "words" not in r.json()
    assert all(s["temperature"] in temperature_schedule(0.4) for s in r.json()["segments"])
    bad = post(**{"timestamp_granularities[]": "phoneme"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"


def test_openai_route_on_the_engine_refuses_an_unknown_model_as_the_main_api_does(engine_client, client):
    """The same 422 ``unknown_model`` and message as the main API's route; a served name is taken (an empty
    upload then gets past the model check to the audio's own error)."""
    def post(c, model: str):
        return c.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"")}, data={"model": model})

    engine, main = post(engine_client, "gpt-9-transcribe"), post(client, "gpt-9-transcribe")
    assert engine.status_code == main.status_code == 422
    assert engine.json() == main.json()
    assert engine.json()["error"]["code"] == "unknown_model" and "whisper-1" in engine.json()["error"]["message"]
    for served in ("whisper-1", "tiny.en"):
        assert post(engine_client, served).json()["error"]["code"] == "empty_audio"


def test_bad_uploads_are_4xx_with_no_server_path_in_the_message(engine_client):
    """A zero-byte or non-audio upload is a 422 with the intake's codes, on both routes; the message never
    names the temporary file it was spooled to."""
    for body, code in ((b"", "empty_audio"), (b"not audio at all", "decode_failed")):
        r = engine_client.post("/v1/audio/transcriptions", files={"file": ("a.wav", body)},
                               data={"model": "whisper"})
        assert r.status_code == 422 and r.json()["error"]["code"] == code
        with engine_client.stream("POST", "/internal/transcribe", content=body) as s:
            last = [json.loads(x) for x in s.iter_lines() if x][-1]
        assert (last["type"], last["code"]) == ("error", code)
        for message in (r.json()["error"]["message"], last["message"]):
            assert "/tmp" not in message and "diarist-engine-" not in message and "/" not in message
    assert r.json()["error"]["message"] == "the file is not a readable media file (Invalid data found " \
                                           "when processing input)"


def test_no_path_survives_in_an_engine_error_message(tmp_path):
    from engine_server.server import _public

    upload = tmp_path / "diarist-engine-abc123"
    assert _public(f"[Errno 2] No such file: '{upload}'", upload) == "[Errno 2] No such file: '<upload>'"
    assert _public("fine", None) == "fine"


def test_http_client_maps_a_dead_server_to_an_engine_outage(tmp_path):
    """Nothing listening: the engine is down, not the job at fault (waited out, no attempt spent)."""
    from diarist.outages import Dependency

    f = data_file("en_jfk_inaugural/jfk.flac")
    with pytest.raises(JobFailure) as e:
        HttpEngineClient("http://127.0.0.1:9", timeout_s=2).transcribe(f, TranscribeOptions())
    assert (e.value.code, e.value.retryable, e.value.outage) == ("engine_unavailable", True, Dependency.ENGINE)
    assert not HttpEngineClient("http://127.0.0.1:9").ready()


def test_http_client_refuses_bad_audio_before_calling_the_engine(tmp_path):
    """The worker decodes: a file that is not audio fails with the decoder's code and spends no attempt,
    whether or not an engine is up (nothing listens on port 9)."""
    f = tmp_path / "a.wav"
    f.write_bytes(b"x")
    with pytest.raises(JobFailure) as e:
        HttpEngineClient("http://127.0.0.1:9", timeout_s=2).transcribe(f, TranscribeOptions())
    assert (e.value.code, e.value.retryable, e.value.outage) == ("decode_failed", False, None)


def _pcm_post(engine_client, audio, fmt_header: str, body: bytes, options: dict | None = None) -> list[dict]:
    from engine_server.protocol import OPTIONS_HEADER, PCM_HEADER

    headers = {PCM_HEADER: fmt_header, OPTIONS_HEADER: json.dumps(options or {})}
    with engine_client.stream("POST", "/internal/transcribe", content=body, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            return [{"status": r.status_code, **r.json()}]
        return [json.loads(x) for x in r.iter_lines() if x]


def test_decoded_audio_gives_the_same_transcript_as_the_file(engine_client):
    """What workers send (samples + PcmFormat) is transcribed exactly as the file the server decodes itself."""
    from transcription.audio import decode_audio

    path = data_file("en_jfk_inaugural/jfk.flac")
    audio = decode_audio(path)
    fmt = audio.pcm_format()
    assert (fmt.channels, fmt.frames, fmt.sample_rate, fmt.codec) == (1, audio.samples.shape[1], 16_000, "flac")
    pcm = _pcm_post(engine_client, audio, fmt.to_header(), b"".join(audio.pcm_chunks(1000)), {"num_speakers": 1})
    with engine_client.stream("POST", "/internal/transcribe", params={"options": json.dumps({"num_speakers": 1})},
                              content=path.read_bytes()) as r:
        file = [json.loads(x) for x in r.iter_lines() if x]
    assert pcm[-1]["type"] == file[-1]["type"] == "result"
    a, b = pcm[-1]["result"], file[-1]["result"]
    assert a["segments"] == b["segments"] and a["duration"] == b["duration"]
    assert a["metrics"]["output_tokens"] == b["metrics"]["output_tokens"] > 0


def test_decoded_audio_that_does_not_match_its_header_is_refused(engine_client):
    from diarist.pcm import PcmFormat

    fmt = PcmFormat(channels=1, frames=16_000, sample_rate=16_000, source_sample_rate=16_000, source_channels=1)
    short = _pcm_post(engine_client, None, fmt.to_header(), b"\0" * (fmt.nbytes - 4))
    assert short[-1]["status"] == 422 and short[-1]["error"]["code"] == "invalid_pcm"
    long = _pcm_post(engine_client, None, fmt.to_header(), b"\0" * (fmt.nbytes + 4))
    assert long[-1]["status"] == 422 and long[-1]["error"]["code"] == "invalid_pcm"
    rate = PcmFormat(channels=1, frames=4, sample_rate=44_100, source_sample_rate=44_100, source_channels=1)
    wrong = _pcm_post(engine_client, None, rate.to_header(), b"\0" * rate.nbytes)
    assert wrong[-1]["status"] == 422 and wrong[-1]["error"]["code"] == "invalid_pcm"
    for bad in ("not json", json.dumps({"channels": 1}), json.dumps({**vars(fmt), "frames": -1}),
                json.dumps({**vars(fmt), "frames": "16000"})):
        r = _pcm_post(engine_client, None, bad, b"")
        assert r[-1]["status"] == 422 and r[-1]["error"]["code"] == "invalid_request", bad


def test_worker_process_never_imports_torch():
    """Workers are thin: importing the tasks (what `diarist worker` does) must not load torch/CUDA."""
    code = "import sys, worker.tasks, engine_server.client, cli.commands.worker; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_openai_route_on_the_engine_carries_completeness(engine_client):
    body = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
    r = engine_client.post("/v1/audio/transcriptions", files={"file": ("jfk.flac", body)},
                           data={"model": "whisper", "response_format": "json"})
    data = r.json()
    assert r.status_code == 200 and "ask not" in data["text"].lower()
    assert (data["finish_reason"], data["incomplete"], data["warnings"]) == ("stop", False, [])
    assert 0.85 <= data["coverage"] <= 1.0 and r.headers["x-diarist-incomplete"] == "false"
    with engine_client.stream("POST", "/v1/audio/transcriptions", files={"file": ("jfk.flac", body)},
                              data={"model": "whisper", "stream": "true"}) as s:
        events = [json.loads(x[len("data: "):]) for x in s.iter_lines() if x.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "transcript.text.done" and "ask not" in done["text"].lower()
    assert done["finish_reason"] == "stop" and done["incomplete"] is False and done["coverage"] == data["coverage"]


def test_nonfinite_samples_are_counted_by_the_engine_not_taken_from_the_header(engine_client):
    """A PCM body full of NaN is refused (invalid_samples) even when its header claims none; a few are
    replaced and reported."""
    import numpy as np

    from diarist.pcm import PcmFormat

    n = 16_000
    fmt = PcmFormat(channels=1, frames=n, sample_rate=16_000, source_sample_rate=16_000, source_channels=1)
    nan = np.full(n, np.nan, dtype="<f4")
    r = _pcm_post(engine_client, None, fmt.to_header(), nan.tobytes())
    assert r[-1]["status"] == 422 and r[-1]["error"]["code"] == "invalid_samples"
    few = np.zeros(n, dtype="<f4")
    few[:5] = np.inf
    r = _pcm_post(engine_client, None, fmt.to_header(), few.tobytes())
    assert r[-1]["type"] == "result"
    warnings = r[-1]["result"].get("warnings") or []
    assert [w["count"] for w in warnings if w["code"] == "invalid_samples"] == [5]


def test_bad_options_and_oversized_headers_are_refused_before_any_work(engine_client):
    from diarist.pcm import PcmFormat

    fmt = PcmFormat(channels=1, frames=1600, sample_rate=16_000, source_sample_rate=16_000, source_channels=1)
    for bad in ({"num_speakers": "x"}, {"num_speakers": 0}, {"min_speakers": 5, "max_speakers": 2}):
        r = _pcm_post(engine_client, None, fmt.to_header(), b"\0" * fmt.nbytes, bad)
        assert r[-1]["status"] == 422 and r[-1]["error"]["code"] == "invalid_request", bad
    huge = PcmFormat(channels=1, frames=16_000 * 3600 * 7, sample_rate=16_000, source_sample_rate=16_000,
                     source_channels=1)
    r = _pcm_post(engine_client, None, huge.to_header(), b"\0" * 64)
    assert r[-1]["status"] == 422 and r[-1]["error"]["code"] == "too_long"


def test_uploads_are_spooled_under_the_spool_dir_and_removed(stack, tmp_path, monkeypatch):
    """``diarist engine`` passes its scratch directory (diarist.scratch) as ``spool_dir``: a killed server's
    spooled uploads are swept at the next start instead of accumulating in /tmp."""
    from engine_server import server

    spooled, real_mkstemp = [], server.tempfile.mkstemp

    def mkstemp(**kw):
        fd, name = real_mkstemp(**kw)
        spooled.append(name)
        return fd, name

    monkeypatch.setattr(server.tempfile, "mkstemp", mkstemp)
    app = server.create_engine_app(stack.engine, engine_id="spool", spool_dir=tmp_path,
                                   served_models=stack.services.settings.served_model_names)
    with TestClient(app) as c:
        with c.stream("POST", "/internal/transcribe", content=b"not audio at all") as r:
            assert [json.loads(x) for x in r.iter_lines() if x][-1]["code"] == "decode_failed"
        r = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"not audio")}, data={"model": "whisper"})
        assert r.status_code == 422
    assert len(spooled) == 2 and all(Path(p).parent == tmp_path for p in spooled)
    assert list(tmp_path.iterdir()) == []


def test_one_log_line_per_request_in_json(engine_client):
    """Issue 33 item 16: a request's line carries its id, the job id, audio seconds, tokens, finish reason
    and seconds, as keys of the JSON line."""
    import io
    import logging

    from diarist.logs import make_handler
    from engine_server.protocol import JOB_ID_HEADER

    buf = io.StringIO()
    handler, logger = make_handler("json", buf), logging.getLogger("diarist.engine_server")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    job_id = "job_" + "a" * 32
    try:
        body = data_file("en_jfk_inaugural/jfk.flac").read_bytes()
        with engine_client.stream("POST", "/internal/transcribe", content=body, headers={JOB_ID_HEADER: job_id}) as r:
            lines = [json.loads(x) for x in r.iter_lines() if x]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert lines[-1]["type"] == "result"
    out = [json.loads(x) for x in buf.getvalue().splitlines()]
    mine = [o for o in out if "request_id" in o]
    assert len(mine) == 1, out
    o = mine[0]
    assert o["job_id"] == job_id and o["finish_reason"] == "stop" and o["audio_s"] == pytest.approx(11.0, abs=0.01)
    assert o["output_tokens"] > 0 and o["prompt_tokens"] > 0 and o["seconds"] > 0 and o["error"] is None
    assert o["message"].startswith(f"request {o['request_id']} stop: 11.0 s of audio")
