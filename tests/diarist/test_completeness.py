"""Coverage is transcribed speech over detected speech; a transcript missing speech is never complete."""

from __future__ import annotations

import pytest

from diarist.completeness import MAX_UNCOVERED_S, SEAM_GAP_S, assess, speech_coverage
from diarist.transcript import Transcript


def seg(start, end, text="words"):
    return {"speaker": 0, "start": start, "end": end, "text": text}


def result(segments, speech, finish="stop", duration=120.0, **extra):
    return {"duration": duration, "segments": segments, "speech": speech, "finish_reason": finish,
            "no_speech": not segments, "metrics": {}, **extra}


def test_coverage_is_transcribed_over_detected_speech():
    # speech 0-10 and 20-30 (20 s); text covers 0-10 and 20-25: 15 of 20 s
    covered, detected = speech_coverage([seg(0, 10), seg(20, 25)], [[0, 10], [20, 30]])
    assert (covered, detected) == (15.0, 20.0)
    # text over silence (10-20) covers no detected speech
    assert speech_coverage([seg(0, 30)], [[0, 10], [20, 30]]) == (20.0, 20.0)
    # spans the model judged not to be speech leave the denominator
    assert speech_coverage([seg(0, 10)], [[0, 10], [20, 30]], non_speech=[[20, 30]]) == (10.0, 10.0)


def test_small_gaps_between_segments_count_as_covered():
    gap = SEAM_GAP_S / 2
    covered, detected = speech_coverage([seg(0, 5), seg(5 + gap, 10)], [[0, 10]])
    assert covered == pytest.approx(10.0) and detected == 10.0
    covered, _ = speech_coverage([seg(0, 5), seg(7, 10)], [[0, 10]])  # a 2 s hole is not covered
    assert covered == pytest.approx(8.0)


def test_a_window_whose_tail_was_lost_lowers_coverage_not_last_end():
    # two 30 s windows of speech; the first lost its last 20 s, the second is whole: the last segment ends
    # at the end of the audio (the old rule said 1.0), but a third of the speech has no text
    r = result([seg(0, 10), seg(30, 60)], [[0, 30], [30, 60]], duration=60.0)
    v = assess(r)
    assert v.coverage == pytest.approx(40 / 60)
    assert v.incomplete and "20.0 s of the detected speech (33%)" in v.reason


def test_tolerances_small_losses_are_complete():
    # a loss below MAX_UNCOVERED_S is tolerated even when it is a large share of a short clip
    short = assess(result([seg(0, 2)], [[0, 2 + MAX_UNCOVERED_S - 1]], duration=20.0))
    assert not short.incomplete and short.coverage < 0.5
    # a long loss that is a small share of a long recording is tolerated too
    long = assess(result([seg(0, 900)], [[0, 1000]], duration=1000.0))
    assert not long.incomplete and long.coverage == pytest.approx(0.9)


def test_no_detected_speech_is_full_coverage_and_complete():
    v = assess(result([], []))
    assert (v.coverage, v.incomplete, v.reason) == (1.0, False, None)


@pytest.mark.parametrize("finish, words", [("length", "budget"), ("repetition", "repetition guard"),
                                           ("abort", "aborted"), ("error", "engine failed")])
def test_stops_other_than_stop_are_incomplete_whatever_the_coverage(finish, words):
    v = assess(result([seg(0, 10)], [[0, 10]], finish=finish))
    assert v.coverage == 1.0 and v.incomplete and words in v.reason


def test_a_pipeline_mark_is_kept_with_its_reason():
    r = result([seg(0, 10)], [[0, 10]], incomplete=True, incomplete_reason="window 3 failed after re-decoding")
    assert assess(r).fields() == {"coverage": 1.0, "incomplete": True,
                                  "incomplete_reason": "window 3 failed after re-decoding"}


def test_without_speech_detection_the_given_coverage_is_kept():
    r = result([seg(0, 10)], None, coverage=0.4)
    assert assess(r).coverage == 0.4 and not assess(r).incomplete
    assert assess(result([seg(0, 10)], None)).coverage is None


def test_transcript_applies_the_same_rule():
    r = result([seg(0, 10), seg(30, 60)], [[0, 30], [30, 60]], duration=60.0)
    t = Transcript.from_engine_json(r)
    v = assess(r)
    assert t.coverage == pytest.approx(v.coverage, abs=1e-4) and t.incomplete and t.incomplete_reason == v.reason
    # re-assessing the pipeline's verdict gives the same verdict (the pipeline and the service agree)
    assert assess({**r, **v.fields()}) == v
    ok = Transcript.from_engine_json(result([seg(0.2, 9.9)], [[0, 10]], duration=10.0))
    assert not ok.incomplete and ok.coverage == pytest.approx(0.97)


def test_a_segment_of_a_window_that_still_failed_makes_it_incomplete():
    r = result([seg(0, 10), {**seg(10, 20), "incomplete": True}], [[0, 20]])
    v = assess(r)
    assert v.coverage == 1.0 and v.incomplete
    assert v.reason == "the text at 10.0-20.0 s comes from windows that still failed after re-decoding"
    assert Transcript.from_engine_json(r).incomplete_reason == v.reason  # the service reads the same flag


def test_malformed_model_output_is_incomplete():
    v = assess(result([seg(0, 10)], [[0, 10]], parse_issues=["last segment has no end time"]))
    assert v.incomplete and v.reason == "malformed model output: last segment has no end time"
