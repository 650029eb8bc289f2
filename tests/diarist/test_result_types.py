"""The typed result (diarist.contract.result): its JSON form round-trips and every field is checked by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diarist.contract.errors import ProtocolError
from diarist.contract.result import EngineMetrics, Segment, TranscriptionResult, Word

GOLDEN = Path(__file__).parent / "golden" / "engine_result.json"


def _full() -> TranscriptionResult:
    """A result with every field set, as a MOSS-TD or diarized Whisper result may carry them."""
    return TranscriptionResult(
        duration=12.5, finish_reason="repetition",
        segments=[Segment(0.5, 2.0, "hello there", speaker=0, channel=1, flags=["low_confidence"],
                          words=[Word(" hello", 0.5, 1.0, speaker=0), Word(" there", 1.0, 2.0, extra={"p": 0.9})]),
                  Segment(3.0, None, "unterminated", speaker="S02", extra={"tokens": 3})],
        metrics=EngineMetrics(queue_wait_s=0.1, prompt_tokens=10, output_tokens=20, rtf=0.5),
        pipeline_metrics={"vad_s": 0.02, "windows": 1}, language="en", language_source="detected",
        language_probability=0.93, task="transcribe", model="tiny.en", speech=[[0.4, 4.0]], coverage=0.8,
        no_speech=False, incomplete=True, incomplete_reason="looped", family="moss-td",
        warnings=[{"code": "invalid_samples", "message": "NaN replaced", "count": 3}],
        windows=[{"start": 0.0, "end": 12.5, "status": "ok"}], non_speech=[[5.0, 6.0]],
        turns=[{"speaker": 0, "start": 0.5, "end": 2.0}], random_weights=True, repetition="tail loop",
        marker_interval_s=2.0, parse_issues=["unclosed tag"], sections=[{"start": 0.0, "end": 12.5}],
        engine_id="http://127.0.0.1:8001", extra={"new_field": [1, 2]})


def test_a_result_with_every_field_round_trips_through_its_json():
    r = _full()
    wire = json.loads(json.dumps(r.to_json()))  # through real JSON text, as the engine stream carries it
    assert TranscriptionResult.from_json(wire) == r
    assert wire["metrics"] == {"queue_wait_s": 0.1, "prompt_tokens": 10, "output_tokens": 20, "rtf": 0.5,
                               "vad_s": 0.02, "windows": 1}
    assert wire["segments"][1] == {"start": 3.0, "end": None, "text": "unterminated", "speaker": "S02", "tokens": 3}
    assert wire["segments"][0]["words"][1] == {"word": " there", "start": 1.0, "end": 2.0, "p": 0.9}
    assert wire["new_field"] == [1, 2]


def test_the_golden_engine_result_keeps_its_wire_form():
    raw = json.loads(GOLDEN.read_text())
    r = TranscriptionResult.from_json(raw)
    assert r.segments[0].speaker == 1 and r.segments[0].words[0] == Word(" Yes", 2.9, 3.2)
    assert r.language_source == "assumed" and r.coverage is None
    # the one difference: a null field is written as absent (every reader takes the two alike)
    assert r.to_json() == _without_nulls(raw)
    assert TranscriptionResult.from_json(r.to_json()) == r


def _without_nulls(raw: dict) -> dict:
    """``raw`` without its null fields, in the result and in its segments."""
    out = {k: v for k, v in raw.items() if v is not None}
    out["segments"] = [{k: v for k, v in s.items() if v is not None or k in ("start", "end")} for s in out["segments"]]
    return out


def _raw(**changes) -> dict:
    raw = {"duration": 2.0, "finish_reason": "stop", "metrics": {}, "segments": [{"start": 0, "end": 1, "text": "a"}]}
    return {k: v for k, v in {**raw, **changes}.items() if v is not ...}


@pytest.mark.parametrize(("raw", "says"), [
    ([], "the result must be a JSON object"),
    (_raw(duration=...), "the result has no 'duration'"),
    (_raw(segments=...), "the result has no 'segments'"),
    (_raw(metrics=...), "the result has no 'metrics'"),
    (_raw(duration="2"), "duration must be a finite number"),
    (_raw(finish_reason="done"), "finish_reason must be one of"),
    (_raw(language=3), "language must be a string"),
    (_raw(no_speech="no"), "no_speech must be true or false"),
    (_raw(turns={}), "turns must be a list"),
    (_raw(metrics={"rtf": "fast"}), "metrics.rtf must be a number"),
    (_raw(segments=[{"start": 0, "end": 1, "text": "a", "speaker": 1.5}]), "segment 0 of the result: speaker must be"),
    (_raw(segments=[{"start": 0, "end": 1, "text": "a", "flags": [1]}]), "flags must be a list of strings"),
    (_raw(segments=[{"start": 0, "end": 1, "text": "a", "channel": True}]), "channel must be an integer"),
    (_raw(segments=[{"start": 0, "end": 1, "text": "a", "words": [{"start": 0, "end": 1}]}]),
     "segment 0 of the result word 0 has no 'word'"),
])
def test_a_missing_or_mistyped_field_is_a_protocol_error_naming_it(raw, says):
    with pytest.raises(ProtocolError, match=says):
        TranscriptionResult.from_json(raw)


def test_numpy_scalars_of_the_pipeline_are_numbers():
    np = pytest.importorskip("numpy")
    r = TranscriptionResult.from_json(_raw(duration=np.float32(2.0), segments=[
        {"start": np.float64(0.5), "end": np.float32(1.0), "text": "a", "speaker": np.int64(2)}]))
    assert r.duration == 2.0 and r.segments[0].speaker == 2
