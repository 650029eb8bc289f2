"""The engine server's wire (engine_server.protocol) and the HTTP client reading it, over a loopback stand-in
for the server: the request's headers, checked events, and a malformed line as a clear retryable failure."""

from __future__ import annotations

import json

import pytest

from diarist.contract.errors import InvalidRequest
from diarist.contract.options import TranscribeOptions
from diarist.pcm import PcmFormat
from engine_server.client import HttpEngineClient, JobFailure
from engine_server.protocol import (
    ADMISSION_CLASS_HEADER,
    OPTIONS_HEADER,
    PCM_HEADER,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    read_request,
    request_headers,
)
from tests.conftest import wav_bytes
from tests.stand_in_engine import stand_in_engine
from tests.worker.fakes import engine_result

FMT = PcmFormat(channels=1, frames=1600, sample_rate=16_000, source_sample_rate=44_100, source_channels=2,
                codec="pcm_s16le", container="wav")
CLASSES = ("default", "short", "long")


def test_request_headers_read_back_into_the_same_request():
    opts = TranscribeOptions(language="de", num_speakers=2, admission_class="long", max_new_tokens=9)
    headers = request_headers(opts, FMT, job_id="job-1")
    assert headers[PROTOCOL_HEADER] == str(PROTOCOL_VERSION) and headers["content-length"] == str(FMT.nbytes)
    assert json.loads(headers[OPTIONS_HEADER]) == {"language": "de", "num_speakers": 2}  # job options only
    req = read_request(headers, CLASSES)
    assert (req.pcm, req.job_id, req.options.admission_class) == (FMT, "job-1", "long")
    assert req.options == TranscribeOptions(language="de", num_speakers=2, admission_class="long")
    # an old client: no version, options in the query string, no PCM (a media file), no job id
    old = read_request({}, CLASSES, query_options='{"prompt": "Zoe"}')
    assert (old.options.prompt, old.options.admission_class, old.pcm, old.job_id) == ("Zoe", "default", None, None)


@pytest.mark.parametrize(("headers", "code", "says"), [
    ({PROTOCOL_HEADER: "2"}, "unsupported_protocol", "speaks version 1"),
    ({ADMISSION_CLASS_HEADER: "urgent"}, "invalid_request", "admission_class must be one of default, short, long"),
    ({OPTIONS_HEADER: "{not json"}, "invalid_request", "options: "),
    ({OPTIONS_HEADER: '{"num_speakers": "3"}'}, "invalid_request", "num_speakers must be an integer"),
    ({PCM_HEADER: '{"channels": 1}'}, "invalid_request", "x-diarist-pcm: "),
    ({PCM_HEADER: FMT.to_header().replace('"frames": 1600', '"frames": 0')}, "invalid_request", "positive integers"),
])
def test_a_bad_request_is_refused_by_its_headers(headers, code, says):
    with pytest.raises(InvalidRequest, match=says) as e:
        read_request(headers, CLASSES)
    assert (e.value.code, e.value.status) == (code, 422)


@pytest.fixture
def stand_in():
    """A loopback server that answers ``POST /internal/transcribe`` with the NDJSON lines in ``lines``."""
    lines: list[str] = []
    with stand_in_engine(lambda: lines) as (url, seen):
        yield url, lines, seen


def test_the_client_hands_checked_events_to_its_caller_and_returns_the_result(stand_in, tmp_path):
    url, lines, seen = stand_in
    lines += [json.dumps({"type": "queued", "duration": 0.5}), json.dumps({"type": "started"}),
              json.dumps({"type": "delta", "text": "hello", "extra": 1}),
              json.dumps({"type": "segment", "start": 0.0, "end": None, "text": "hello", "speaker": "S01"}),
              json.dumps({"type": "result", "result": engine_result()})]
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(0.5))
    events: list[tuple[str, dict]] = []
    options = TranscribeOptions.from_json({"language": "en", "model": "m", "webhook_url": "http://x"},
                                          admission_class="short")  # as the worker reads a job's options
    out = HttpEngineClient(url).transcribe(audio, options, on_event=lambda k, p: events.append((k, p)))
    assert events == [("stage", {"stage": "decode"}),  # the worker's own decode, before the engine's stream
                      ("queued", {"duration": 0.5}), ("started", {}), ("delta", {"text": "hello"}),
                      ("segment", {"start": 0.0, "end": None, "text": "hello", "speaker": "S01"})]
    assert out.to_json()["segments"] == engine_result()["segments"] and out.pipeline_metrics["worker_decode_s"] >= 0
    assert json.loads(seen[0]["headers"][OPTIONS_HEADER]) == {"language": "en"}
    assert (seen[0]["headers"][ADMISSION_CLASS_HEADER], seen[0]["headers"][PROTOCOL_HEADER]) == ("short", str(PROTOCOL_VERSION))


@pytest.mark.parametrize(("line", "says"), [
    ('{"type": "segment", "start": 0, "text": "x"}', "segment event without its 'end'"),
    ('{"type": "result", "result": {"duration": 1, "finish_reason": "stop", "segments": []}}',
     "the result has no 'metrics'"),
    ("<html>oops</html>", "not JSON"),
])
def test_a_malformed_line_fails_the_attempt_as_a_retryable_protocol_error(stand_in, tmp_path, line, says):
    url, lines, _ = stand_in
    lines += [json.dumps({"type": "started"}), line]
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(0.5))
    with pytest.raises(JobFailure, match=says) as e:
        HttpEngineClient(url).transcribe(audio, TranscribeOptions())
    assert (e.value.code, e.value.retryable, e.value.outage) == ("engine_protocol", True, None)


