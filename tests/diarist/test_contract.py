"""The typed contract between the engine side and the service (diarist.contract): options, events, the
result check and the coded-error base, as they cross the engine server's wire."""

from __future__ import annotations

import subprocess
import sys

import pytest

from diarist.contract.errors import CodedError, InvalidRequest, ProtocolError
from diarist.contract.events import (
    Delta,
    ErrorLine,
    Finished,
    Queued,
    ResultLine,
    SegmentDone,
    Stage,
    Started,
    from_line,
    make,
    payload,
    to_line,
)
from diarist.contract.options import OPTION_FIELDS, TranscribeOptions
from diarist.contract.result import FINISH_REASONS, METRIC_FIELDS, TranscriptionResult, check_result


def _result(**over) -> dict:
    base = {"duration": 2.5, "finish_reason": "stop", "segments": [{"start": 0.1, "end": None, "text": "hi"}],
            "metrics": {"rtf": 0.2}, "model": "tiny.en"}
    return {**base, **over}


def test_every_line_type_round_trips_through_its_json_line():
    lines = [Stage("decode"), Queued(12.5), Started(), Delta("hello "), SegmentDone(1.0, None, "hello", "S01"),
             Finished("length", {"decode_s": 0.5, "output_tokens": 7}), ResultLine(TranscriptionResult.from_json(_result())),
             ErrorLine("too_long", "the audio lasts 9000 s")]
    for line in lines:
        text = to_line(line)
        assert text.endswith("\n") and text.count("\n") == 1
        assert from_line(text) == line
    assert payload(SegmentDone(1.0, 2.0, "x")) == {"start": 1.0, "end": 2.0, "text": "x", "speaker": None}


@pytest.mark.parametrize(("line", "says"), [
    ("not json", "not JSON"),
    ('["delta"]', "not an object with a type"),
    ('{"text": "x"}', "not an object with a type"),
    ('{"type": "bogus"}', "unknown event type 'bogus'"),
    ('{"type": "delta"}', "without its 'text'"),
    ('{"type": "delta", "text": 3}', "text must be a string"),
    ('{"type": "segment", "start": "1.0", "end": 2, "text": "x"}', "start must be a number"),
    ('{"type": "segment", "start": 1, "end": 2, "text": "x", "speaker": true}', "speaker must be a label"),
    ('{"type": "finished", "finish_reason": "done", "metrics": {}}', "unknown finish_reason 'done'"),
    ('{"type": "stage", "stage": "warmup"}', "unknown stage 'warmup'"),
    ('{"type": "result", "result": {"duration": 1}}', "finish_reason must be one of"),
    ('{"type": "result", "result": []}', "result event: result must be an object"),
    ('{"type": "error", "code": "x"}', "without its 'message'"),
])
def test_a_malformed_line_is_a_protocol_error_that_names_the_fault(line, says):
    with pytest.raises(ProtocolError, match=says) as e:
        from_line(line)
    assert (e.value.code, e.value.status, e.value.retryable) == ("engine_protocol", 502, True)


def test_unknown_fields_are_ignored_and_numpy_scalars_become_numbers():
    np = pytest.importorskip("numpy")
    assert from_line('{"type": "delta", "text": "a", "window": 3}') == Delta("a")
    line = make("segment", {"start": np.float32(1.5), "end": np.float64(2.0), "text": "a", "speaker": np.int64(2)})
    assert to_line(line) == '{"type": "segment", "start": 1.5, "end": 2.0, "text": "a", "speaker": 2}\n'


@pytest.mark.parametrize(("result", "says"), [
    (_result(duration=-1), "duration must be a finite number >= 0"),
    (_result(duration=float("nan")), "duration must be a finite number"),
    (_result(duration=True), "duration must be a finite number"),
    (_result(finish_reason=None), "finish_reason must be one of"),
    (_result(segments=None), "segments must be a list"),
    (_result(segments=[{"start": 0, "end": 1}]), "segment 0 of the result has no 'text'"),
    (_result(segments=[{"start": "0", "end": 1, "text": "x"}]), "segment 0 of the result: start must be a finite number"),
    (_result(metrics=None), "metrics must be a JSON object"),
])
def test_check_result_refuses_a_result_of_the_wrong_shape(result, says):
    with pytest.raises(ProtocolError, match=says):
        check_result(result)


def test_check_result_takes_every_finish_reason_and_returns_the_result():
    for reason in FINISH_REASONS:
        r = _result(finish_reason=reason)
        assert check_result(r) is r


def test_options_from_json_keeps_the_job_options_and_checks_them():
    opts = TranscribeOptions.from_json({"language": "de", "num_speakers": 2, "model": "tiny.en",
                                        "webhook_url": "http://x", "prompt": None}, admission_class="long")
    assert (opts.language, opts.num_speakers, opts.prompt, opts.admission_class) == ("de", 2, None, "long")
    assert opts.to_json() == {"language": "de", "num_speakers": 2}
    assert TranscribeOptions.from_json(opts.to_json(), admission_class="long") == opts
    assert set(opts.to_json()) <= set(OPTION_FIELDS)
    assert OPTION_FIELDS == ("language", "task", "prompt", "num_speakers", "min_speakers", "max_speakers",
                             "multichannel", "temperature")
    assert TranscribeOptions.from_json({"temperature": 0}).temperature == 0.0  # JSON's 0 for 0.0
    for bad, says in ([], "must be a JSON object"), ({"num_speakers": "2"}, "num_speakers must be an integer"), \
            ({"num_speakers": True}, "num_speakers must be an integer"), \
            ({"multichannel": 1}, "multichannel must be true or false"), ({"language": 3}, "language must be a string"), \
            ({"temperature": "0.2"}, "temperature must be a number"), ({"temperature": 1.5}, "between 0 and 1"), \
            ({"temperature": True}, "temperature must be a number"), \
            ({"max_speakers": 65}, "between 1 and 64"), ({"min_speakers": 3, "max_speakers": 2}, "min_speakers"), \
            ({"num_speakers": 3, "max_speakers": 2}, r"num_speakers must lie between min_speakers and max_speakers"):
        with pytest.raises(InvalidRequest, match=says) as e:
            TranscribeOptions.from_json(bad)
        assert (e.value.code, e.value.status) == ("invalid_request", 422)


def test_the_service_and_the_pipeline_share_the_contract():
    """The API's option list and metric fields, the job row's metric columns, the transcript's finish reasons
    and the pipeline's errors all come from diarist.contract."""
    from api.schemas import JobOptions, Metrics
    from diarist.http.errors import ApiError
    from diarist.models import JobMetrics
    from diarist.pcm import InvalidSamples
    from diarist.transcript import Transcript
    from engine.request import RequestRejected
    from engine_server.client import JobFailure
    from transcription.audio import AudioError
    from transcription.errors import EngineError, Rejected

    assert set(OPTION_FIELDS) <= set(JobOptions.model_fields)
    assert JobOptions(num_speakers=2, webhook_url="http://x", model="m").engine_options() == {
        "num_speakers": 2, "multichannel": False}  # what a job stores; the worker sends what differs from defaults
    assert list(Metrics.model_fields)[:len(METRIC_FIELDS)] == list(METRIC_FIELDS)
    assert all(hasattr(JobMetrics, k) for k in METRIC_FIELDS)
    with pytest.raises(ValueError, match="finish_reason"):
        Transcript(duration=1, model="m", finish_reason="done")
    for cls in (ApiError, JobFailure, AudioError, EngineError, Rejected, InvalidSamples, InvalidRequest):
        assert issubclass(cls, CodedError), cls
    rejected = Rejected("too_long", "long")
    assert isinstance(rejected, RequestRejected) and (rejected.status, rejected.retryable) == (422, False)
    assert (EngineError("boom").code, EngineError("boom").status, EngineError("boom").retryable) == \
        ("engine_error", 500, True)
    assert (AudioError("decode_failed", "x").status, InvalidSamples("x").code) == (422, "invalid_samples")
    assert JobFailure.of(EngineError("boom")).retryable and not JobFailure.of(rejected).retryable
    assert str(JobFailure("canceled", "gone")) == "canceled: gone"


def test_the_contract_and_the_wire_import_without_the_service_packages():
    """The engine server's machine has torch, numpy, transformers and safetensors; the contract and the
    protocol module need nothing beyond them (no pydantic, fastapi, sqlalchemy, httpx), nor torch."""
    code = ("import sys, diarist.contract.errors, diarist.contract.options, diarist.contract.result, "
            "diarist.contract.events, engine_server.protocol; "
            "print(sorted(m for m in ('pydantic', 'fastapi', 'sqlalchemy', 'httpx', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
