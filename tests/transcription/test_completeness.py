"""A truncated transcript is never reported as a silent success (issue: completeness)."""

from __future__ import annotations

from diarist.transcript import Transcript
from transcription.transcriber import _mark_completeness


def result(finish="stop", last_end=50.0, speech_end=None, duration=60.0, family=None):
    r = {"duration": duration, "segments": [{"speaker": 0, "start": 0.0, "end": last_end, "text": "hi"}],
         "finish_reason": finish, "coverage": last_end / duration, "no_speech": False, "metrics": {}}
    if speech_end is not None:
        r["metrics"]["speech_end_s"] = speech_end
    if family:
        r["family"] = family
    return r


def test_budget_and_loop_stops_are_incomplete():
    for finish, words in (("length", "budget"), ("repetition", "repetition")):
        r = result(finish)
        _mark_completeness(r)
        assert r["incomplete"] and words in r["incomplete_reason"]
        t = Transcript.from_engine(r)
        assert t.incomplete and t.finish_reason == finish


def test_coverage_far_below_speech_is_incomplete():
    r = result(last_end=100.0, speech_end=1800.0, duration=1900.0)
    _mark_completeness(r)
    assert r["incomplete"] and "1800.0" in r["incomplete_reason"]
    assert Transcript.from_engine(r).incomplete


def test_end_to_end_model_without_vad_compares_with_duration():
    r = result(last_end=600.0, duration=2280.0, family="moss-td")
    _mark_completeness(r)
    assert r["incomplete"]
    ok = result(last_end=2270.0, duration=2280.0, family="moss-td")
    _mark_completeness(ok)
    assert ok["incomplete"] is False


def test_a_complete_transcript_is_complete():
    r = result(last_end=58.0, speech_end=59.0)
    _mark_completeness(r)
    assert r["incomplete"] is False
    assert not Transcript.from_engine(r).incomplete
