"""Transcript schema: normalisation of engine results (order, clamping, labels, coverage)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diarist.contract.errors import ProtocolError
from diarist.contract.result import TranscriptionResult
from diarist.transcript import Transcript


def raw_result(segments, duration=10.0, **kw):
    base = {"duration": duration, "language": "en", "model": "tiny.en", "segments": segments,
            "finish_reason": "stop", "coverage": None, "no_speech": False, "metrics": {}}
    base.update(kw)
    return base


def result(segments, duration=10.0, **kw):
    """The typed result (what the engine clients return) of :func:`raw_result`."""
    return TranscriptionResult.from_json(raw_result(segments, duration, **kw))


def seg(speaker, start, end, text="x", words=None):
    return {"speaker": speaker, "start": start, "end": end, "text": text, "words": words}


def test_sorted_by_start_ids_sequential_and_labels_by_first_appearance():
    t = Transcript.from_engine(result([seg(7, 5.0, 6.0, "c"), seg(2, 1.0, 2.0, "a"), seg(7, 3.0, 4.0, "b"),
                                       seg(2, 8.0, 9.0, "d")]))
    assert [s.text for s in t.segments] == ["a", "b", "c", "d"]
    assert [s.id for s in t.segments] == [0, 1, 2, 3]
    # cluster 2 speaks first -> S01 everywhere, cluster 7 -> S02 everywhere
    assert [s.speaker for s in t.segments] == ["S01", "S02", "S02", "S01"]
    assert t.speakers == ["S01", "S02"]
    assert t.speaker_names is None


def test_moss_style_labels_are_renumbered_by_first_appearance():
    t = Transcript.from_engine(result([seg("S03", 0.5, 1.0), seg("S01", 1.5, 2.0), seg("S03", 2.5, 3.0)]))
    assert [s.speaker for s in t.segments] == ["S01", "S02", "S01"]


def test_channel_labels_are_kept_as_speaker_names():
    segs = [dict(seg("right", 0.2, 1.0), channel=1), dict(seg("left", 0.5, 2.0), channel=0)]
    t = Transcript.from_engine(result(segs))
    assert [(s.speaker, s.channel) for s in t.segments] == [("S01", 1), ("S02", 0)]
    assert t.speaker_names == {"S01": "right", "S02": "left"}


def test_times_clamped_to_duration_and_end_not_before_start():
    t = Transcript.from_engine(result([seg(0, -0.5, 1.0), seg(1, 8.0, 12.5), seg(2, 9.5, 9.0)], duration=10.0,
                                      speech=[[0.0, 1.0], [8.0, 10.0]]))
    assert [(s.start, s.end) for s in t.segments] == [(0.0, 1.0), (8.0, 10.0), (9.5, 9.5)]
    assert t.coverage == 1.0  # the clamped segments cover all detected speech


def test_monotonic_within_a_speaker_but_overlap_between_speakers_kept():
    t = Transcript.from_engine(result([seg(0, 1.0, 4.0, "a"), seg(0, 3.0, 5.0, "b"), seg(0, 3.5, 3.8, "c"),
                                       seg(1, 2.0, 3.0, "other")]))
    by = {s.text: (s.start, s.end) for s in t.segments}
    assert by == {"a": (1.0, 4.0), "other": (2.0, 3.0), "b": (4.0, 5.0), "c": (5.0, 5.0)}
    assert [s.text for s in t.segments] == ["a", "other", "b", "c"]


def test_unknown_speaker_is_none_and_not_listed():
    t = Transcript.from_engine(result([seg(None, 0.0, 1.0), seg("", 1.0, 2.0), seg(4, 2.0, 3.0)]))
    assert [s.speaker for s in t.segments] == [None, None, "S01"]
    assert t.speakers == ["S01"]


def test_missing_end_runs_to_next_start_or_duration_and_empty_text_dropped():
    t = Transcript.from_engine(result([seg(0, 1.0, None, "a"), seg(1, 4.0, None, "b"), seg(1, 5.0, 6.0, "  ")],
                                      duration=9.0))
    assert [(s.text, s.start, s.end) for s in t.segments] == [("a", 1.0, 4.0), ("b", 4.0, 5.0)]


def test_text_whitespace_collapsed():
    t = Transcript.from_engine(result([seg(0, 0.0, 1.0, "  hello \n\n  world\t")]))
    assert t.segments[0].text == "hello world"


def test_words_clamped_monotonic_and_labelled():
    words = [{"word": " hi", "start": -0.1, "end": 0.4}, {"word": " there", "start": 0.3, "end": 20.0},
             {"word": " ", "start": 1.0, "end": 1.1}]
    t = Transcript.from_engine(result([seg(3, 0.0, 1.0, "hi there", words)], duration=2.0))
    w = t.segments[0].words
    assert [(x.word, x.start, x.end, x.speaker) for x in w] == [(" hi", 0.0, 0.4, "S01"), (" there", 0.4, 2.0, "S01")]


def test_times_are_rounded_to_the_millisecond():
    """Alignment arithmetic leaves float noise (1.7493750000000001); every output carries milliseconds."""
    words = [{"word": " a", "start": 1.7493750000000001, "end": 8.886875000000002}]
    t = Transcript.from_engine(result([seg(0, 1.7493750000000001, 8.886875000000002, "a", words)],
                                      duration=12.34567, turns=[{"speaker": 0, "start": 0.0004, "end": 9.9996}]))
    s = t.segments[0]
    assert (s.start, s.end, s.words[0].start, s.words[0].end) == (1.749, 8.887, 1.749, 8.887)
    assert t.duration == 12.346 and (t.turns[0].start, t.turns[0].end) == (0.0, 10.0)
    assert '"start": 1.749,' in t.model_dump_json(indent=1).replace("\n", "")
    # a turn shorter than a millisecond has no length left and is dropped like any empty turn
    t = Transcript.from_engine(result([seg(0, 1.0, 2.0)], turns=[{"speaker": 0, "start": 1.0001, "end": 1.0004},
                                                                  {"speaker": 0, "start": 1.0, "end": 2.0}]))
    assert [(x.start, x.end) for x in t.turns] == [(1.0, 2.0)]


def test_coverage_finish_reason_and_incomplete():
    t = Transcript.from_engine(result([seg(0, 0.0, 2.5)], duration=10.0, finish_reason="length",
                                      speech=[[0.0, 10.0]]))
    assert t.coverage == 0.25  # 2.5 of the 10 s of detected speech
    assert t.incomplete and "token budget" in t.incomplete_reason
    ok = Transcript.from_engine(result([seg(0, 0.0, 2.5)], duration=10.0))
    assert not ok.incomplete and ok.incomplete_reason is None and not ok.no_speech


def test_empty_result_is_no_speech():
    t = Transcript.from_engine(result([], duration=5.0, speech=[]))
    assert t.no_speech and t.segments == [] and t.speakers == [] and t.coverage == 1.0  # nothing was missed
    zero = Transcript.from_engine(result([], duration=0.0))
    assert zero.coverage is None and zero.no_speech  # no speech detection in the result: coverage unknown
    err = Transcript.from_engine(result([], duration=5.0, finish_reason="error"))
    assert not err.no_speech and err.incomplete


@pytest.mark.parametrize("bad", [None, -1.0, float("nan"), "x"])
def test_invalid_duration_raises(bad):
    with pytest.raises(ProtocolError, match="duration"):  # at the boundary, reading the JSON
        Transcript.from_engine_json(raw_result([], duration=bad))
    with pytest.raises(ValueError, match="duration"):  # a typed result built wrong in this process
        Transcript.from_engine(TranscriptionResult(duration=bad, finish_reason="stop", segments=[]))


def test_unknown_finish_reason_raises():
    with pytest.raises(ProtocolError, match="finish_reason"):
        Transcript.from_engine_json(raw_result([], finish_reason="tired"))
    with pytest.raises(ValueError):
        Transcript.from_engine(TranscriptionResult(duration=1.0, finish_reason="tired", segments=[]))


_SPEAKERS = st.one_of(st.none(), st.integers(0, 5), st.sampled_from(["S01", "S02", "S07", "left", "right"]))
_TIME = st.one_of(st.none(), st.floats(-5, 40, allow_nan=False))


@st.composite
def _results(draw):
    duration = draw(st.floats(0, 30, allow_nan=False))
    segs = [seg(draw(_SPEAKERS), draw(st.floats(-5, 40, allow_nan=False)), draw(_TIME),
                draw(st.sampled_from(["a", "b c", " ", "第一"])))
            for _ in range(draw(st.integers(0, 12)))]
    speech = [[a, a + draw(st.floats(0, 10, allow_nan=False))] for a in draw(st.lists(st.floats(0, 30), max_size=4))]
    return result(segs, duration=duration, speech=speech)


@settings(max_examples=300, deadline=None)
@given(_results())
def test_invariants_hold_for_any_engine_result(r):
    t = Transcript.from_engine(r)
    starts = [s.start for s in t.segments]
    assert starts == sorted(starts)
    assert all(0 <= s.start <= s.end <= t.duration for s in t.segments)
    last_end = {}
    for s in t.segments:
        if s.speaker is not None:
            assert s.start >= last_end.get(s.speaker, 0.0)
            last_end[s.speaker] = s.end
    first_seen = list(dict.fromkeys(s.speaker for s in t.segments if s.speaker))
    assert first_seen == t.speakers == [f"S{i:02d}" for i in range(1, len(t.speakers) + 1)]
    assert 0.0 <= t.coverage <= 1.0
    if not any(e > s for s, e in r.speech):
        assert t.coverage == 1.0  # no detected speech: none was missed
    assert Transcript.model_validate_json(t.model_dump_json()) == t


def test_text_joins_cjk_segments_without_space():
    t = Transcript.from_engine(result([seg(0, 0.0, 1.0, "好的。"), seg(1, 1.0, 2.0, "我们开始"),
                                       seg(0, 2.0, 3.0, "OK then"), seg(1, 3.0, 4.0, "再见")]))
    assert t.text == "好的。我们开始 OK then 再见"


_MISSING = object()


@pytest.mark.parametrize("start,end", [(None, 5.0), (float("nan"), 5.0), (float("-inf"), 5.0), ("abc", 5.0),
                                       (_MISSING, 5.0), (2.0, None), (2.0, float("inf")), (_MISSING, _MISSING)])
def test_turn_without_a_valid_time_is_dropped_not_stretched_to_the_recording_edge(start, end):
    turn = {"speaker": 0, **{k: v for k, v in (("start", start), ("end", end)) if v is not _MISSING}}
    t = Transcript.from_engine(result([seg(0, 1.0, 6.0)], turns=[turn, {"speaker": 0, "start": 7.0, "end": 8.0}]))
    assert [(x.start, x.end) for x in t.turns] == [(7.0, 8.0)]


def test_numpy_integer_speakers_share_labels_with_int_speakers():
    np = pytest.importorskip("numpy")
    t = Transcript.from_engine(result([seg(0, 1.0, 2.0), seg(1, 3.0, 4.0)],
                                      turns=[{"speaker": np.int64(1), "start": 3.0, "end": 4.0},
                                             {"speaker": np.int32(0), "start": 1.0, "end": 2.0}]))
    assert t.speakers == ["S01", "S02"]
    assert [(x.speaker, x.start) for x in t.turns] == [("S01", 1.0), ("S02", 3.0)]


@pytest.mark.parametrize("where", ["duration", "segment", "turn"])
def test_times_too_large_for_a_float_are_refused_at_the_boundary_or_dropped(where):
    huge = 10**400  # float(huge) raises OverflowError, not ValueError
    r = raw_result([seg(0, 1.0, 2.0)], turns=[{"speaker": 0, "start": 1.0, "end": 2.0}])
    if where in ("duration", "segment"):  # refused at the boundary, the field named
        if where == "duration":
            r["duration"] = huge
        else:
            r["segments"].append(seg(1, 3.0, huge))
        with pytest.raises(ProtocolError, match="duration" if where == "duration" else "segment 1 .*end"):
            TranscriptionResult.from_json(r)
        return
    r["turns"].append({"speaker": 0, "start": huge, "end": 3.0})  # turns are read leniently: dropped
    t = Transcript.from_engine_json(r)
    assert all(0 <= s.start <= s.end <= t.duration for s in t.segments)
    assert [(x.start, x.end) for x in t.turns] == [(1.0, 2.0)]


@pytest.mark.parametrize("field", ["segments", "turns"])
def test_stored_json_with_non_finite_times_is_refused(field):
    span = '{"speaker": "S01", "start": 1.0, "end": Infinity' + (', "id": 0, "text": "hi"}' if field == "segments"
                                                                  else "}")
    with pytest.raises(ValueError):
        Transcript.model_validate_json(f'{{"duration": 10.0, "model": "m", "{field}": [{span}]}}')


def test_no_usable_turn_falls_back_to_segments():
    result = {"duration": 5.0, "model": "m", "finish_reason": "stop", "metrics": {},
              "segments": [{"speaker": 0, "start": 0.5, "end": 2.0, "text": "hi"}],
              "turns": [{"speaker": 0, "start": None, "end": 1.0}, {"speaker": 0, "start": 3.0, "end": 3.0}]}
    t = Transcript.from_engine_json(result)
    assert t.turns is None  # an empty list would make the RTTM say nobody spoke
    from diarist.formats import to_rttm

    assert to_rttm(t).split()[3:5] == ["0.500", "1.500"]
    assert Transcript.from_engine_json({**result, "segments": []}).turns == []
