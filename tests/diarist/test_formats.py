"""Exporters: golden files for every format, plus parse-back with well-kept parsers
(pyannote.database for RTTM, srt for SubRip, webvtt-py for WebVTT, the openai client's
response models for verbose_json / diarized_json)."""

import html
import json
import os
from pathlib import Path

import pytest

from diarist.formats import (
    SUPPORTED_FORMATS,
    render,
    to_diarized_json,
    to_rttm,
    to_srt,
    to_txt,
    to_verbose_json,
    to_vtt,
)
from diarist.transcript import Transcript

GOLDEN = Path(__file__).parent / "golden"
EXT = {"json": "json", "txt": "txt", "text": "text.txt", "srt": "srt", "vtt": "vtt", "rttm": "rttm",
       "verbose_json": "verbose.json", "diarized_json": "diarized.json", "svg": "svg"}


@pytest.fixture(scope="module")
def t():
    return Transcript.from_engine_json(json.loads((GOLDEN / "engine_result.json").read_text()))


def empty():
    return Transcript.from_engine_json({"duration": 3.0, "language": None, "model": "m", "segments": [], "metrics": {},
                                   "finish_reason": "stop"})


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_matches_golden_file(t, fmt):
    body, media_type = render(t, fmt, file_id="meeting 01")
    path = GOLDEN / f"expected.{EXT[fmt]}"
    if os.environ.get("DIARIST_UPDATE_GOLDEN"):
        path.write_text(body, encoding="utf-8")
    assert body == path.read_text(encoding="utf-8")
    assert media_type.split(";")[0] in {"application/json", "text/plain", "application/x-subrip", "text/vtt",
                                        "image/svg+xml"}


def test_unknown_format_lists_supported_ones(t):
    with pytest.raises(ValueError) as e:
        render(t, "docx")
    for fmt in SUPPORTED_FORMATS:
        assert fmt in str(e.value)
    assert render(t, " SRT ")[0] == to_srt(t)


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_empty_transcript_renders(fmt):
    body, _ = render(empty(), fmt)
    assert isinstance(body, str)


def test_txt_line_format(t):
    lines = to_txt(t).splitlines()
    assert lines[0] == "[0.52-2.31] S01: Morning, shall we start?"
    assert lines[3] == "[7.00-7.50] [inaudible]"  # unknown speaker: no label
    assert len(lines) == len(t.segments)


def test_json_round_trips(t):
    body, _ = render(t, "json")
    assert Transcript.model_validate_json(body) == t


def test_rttm_parses_back_with_pyannote_database(t, tmp_path):
    from pyannote.database.util import load_rttm

    path = tmp_path / "x.rttm"
    path.write_text(to_rttm(t, "meeting 01"))
    ann = load_rttm(path)["meeting_01"]
    got = sorted((round(s.start, 3), round(s.end, 3), label) for s, _, label in ann.itertracks(yield_label=True))
    want = sorted((round(s.start, 3), round(s.end, 3), s.speaker or "unknown") for s in t.segments if s.end > s.start)
    assert got == want
    assert set(ann.labels()) == {"S01", "S02", "S03", "unknown"}
    for line in to_rttm(t).splitlines():
        f = line.split()
        assert len(f) == 10 and f[0] == "SPEAKER" and f[2] == "1" and f[5:7] == ["<NA>", "<NA>"] and f[8:] == ["<NA>", "<NA>"]


def test_srt_parses_back_with_srt(t):
    import srt

    subs = list(srt.parse(to_srt(t)))
    assert [s.index for s in subs] == list(range(1, len(t.segments) + 1))
    for sub, seg in zip(subs, t.segments):
        assert sub.start.total_seconds() == pytest.approx(seg.start, abs=1e-3)
        assert sub.end.total_seconds() == pytest.approx(max(seg.end, seg.start + 0.001), abs=1e-3)
        assert sub.content == (f"{seg.speaker}: " if seg.speaker else "") + seg.text


def test_vtt_parses_back_with_webvtt_py(t):
    import webvtt

    cues = list(webvtt.from_string(to_vtt(t)))
    assert len(cues) == len(t.segments)
    for cue, seg in zip(cues, t.segments):
        assert cue.voice == seg.speaker
        assert html.unescape(cue.text) == seg.text
        h, m, s = cue.start.split(":")
        assert int(h) * 3600 + int(m) * 60 + float(s) == pytest.approx(seg.start, abs=1e-3)
    assert "<v S02>Yes -- Q&amp;A &lt;after&gt; the figures.</v>" in to_vtt(t)


def test_diarized_json_validates_against_openai_model(t):
    from openai.types.audio import TranscriptionDiarized

    body = json.loads(to_diarized_json(t))
    parsed = TranscriptionDiarized.model_validate(body)
    assert [s.speaker for s in parsed.segments] == [s.speaker or "unknown" for s in t.segments]
    assert [(s.start, s.end, s.text) for s in parsed.segments] == [(s.start, s.end, s.text) for s in t.segments]
    assert parsed.text == t.text and parsed.duration == t.duration


def test_verbose_json_has_openai_fields(t):
    from openai.types.audio import TranscriptionSegment, TranscriptionVerbose, TranscriptionWord

    body = json.loads(to_verbose_json(t))
    top = TranscriptionVerbose.model_validate({k: v for k, v in body.items() if k != "segments"})
    assert top.text == t.text and top.language == "en"
    assert len(top.words) == sum(len(s.words) for s in t.segments)
    assert all(isinstance(w, TranscriptionWord) for w in top.words)
    for seg_json, seg in zip(body["segments"], t.segments):
        assert set(TranscriptionSegment.model_fields) <= set(seg_json)
        assert (seg_json["id"], seg_json["start"], seg_json["end"], seg_json["text"], seg_json["speaker"]) == (
            seg.id, seg.start, seg.end, seg.text, seg.speaker)


def test_schema_formats_and_eval_import_without_torch_or_engine():
    import subprocess
    import sys

    code = ("import sys, diarist.transcript, diarist.formats, evaluation.harness, cli.commands.eval; "
            "print(sorted(m for m in ('torch', 'engine', 'jiwer', 'meeteval', 'pyannote') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


def test_rttm_writes_the_diarization_turns_when_present(tmp_path):
    from pyannote.database.util import load_rttm

    result = {"duration": 10.0, "model": "m", "finish_reason": "stop", "metrics": {},
              "segments": [{"speaker": 1, "start": 0.5, "end": 4.0, "text": "hello there"},
                           {"speaker": 0, "start": 4.2, "end": 9.0, "text": "hi"}],
              "turns": [{"speaker": 1, "start": 0.8, "end": 3.9}, {"speaker": 0, "start": 3.5, "end": 8.7},
                        {"speaker": 2, "start": 9.2, "end": 11.0}, {"speaker": 0, "start": 5.0, "end": 5.0}]}
    t = Transcript.from_engine_json(result)
    # labels follow the segments; a speaker with turns but no words comes last
    assert t.speakers == ["S01", "S02", "S03"]
    assert [(x.speaker, x.start, x.end) for x in t.turns] == [("S01", 0.8, 3.9), ("S02", 3.5, 8.7),
                                                              ("S03", 9.2, 10.0)]
    path = tmp_path / "t.rttm"
    path.write_text(to_rttm(t, "rec"))
    ann = load_rttm(path)["rec"]
    got = sorted((round(s.start, 3), round(s.end, 3), lab) for s, _, lab in ann.itertracks(yield_label=True))
    assert got == [(0.8, 3.9, "S01"), (3.5, 8.7, "S02"), (9.2, 10.0, "S03")]  # the overlap is kept
    assert json.loads(render(t, "json")[0])["turns"][1] == {"speaker": "S02", "start": 3.5, "end": 8.7}


def test_json_stored_before_turns_existed_loads_and_renders_every_format(t, tmp_path):
    from pyannote.database.util import load_rttm

    old = json.loads(render(t, "json")[0])
    del old["turns"]
    loaded = Transcript.model_validate_json(json.dumps(old))
    assert loaded.turns is None
    for fmt in SUPPORTED_FORMATS:
        assert render(loaded, fmt)[0] == render(t, fmt)[0]  # the golden result has no turns either
    path = tmp_path / "old.rttm"
    path.write_text(to_rttm(loaded, "old"))
    got = sorted((round(s.start, 3), lab) for s, _, lab in load_rttm(path)["old"].itertracks(yield_label=True))
    assert got == sorted((round(s.start, 3), s.speaker or "unknown") for s in t.segments if s.end > s.start)


_ODD = (None, True, 1.5, -3, "7", "SPEAKER_01", " ", "a b", 10**400, float("nan"), float("inf"), -float("inf"))


def test_odd_engine_turns_give_valid_rttm_lines():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    value = st.one_of(st.sampled_from(_ODD), st.integers(-2, 4), st.floats(-5, 25, allow_nan=False))
    turn = st.one_of(st.fixed_dictionaries({}, optional={"speaker": value, "start": value, "end": value}),
                     st.sampled_from([1, "x", None, [0.0, 1.0, 0]]))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(turn, max_size=8), st.sampled_from([0.0, 0.5, 20.0]))
    def check(turns, duration):
        tr = Transcript.from_engine_json({"duration": duration, "model": "m", "turns": turns, "finish_reason": "stop", "metrics": {},
                                     "segments": [{"speaker": 0, "start": 0.0, "end": 0.4, "text": "hi"}]})
        turns = tr.turns or []  # None: no usable turn, the segments stand in
        assert all(0 <= x.start < x.end <= duration for x in turns)
        assert {x.speaker for x in turns} <= set(tr.speakers)
        for fmt in SUPPORTED_FORMATS:
            render(tr, fmt)
        for line in to_rttm(tr, "rec").splitlines():
            f = line.split(" ")
            assert len(f) == 10 and f[0] == "SPEAKER" and f[7].startswith("S")
            assert 0 <= float(f[3]) and 0 < float(f[4]) and float(f[3]) + float(f[4]) <= duration + 1e-3

    check()


# --- OpenAI route: completeness in every JSON shape, headers on the others ---------------------------


def test_openai_json_shapes_and_done_event_carry_completeness(t):
    from diarist.formats import OPENAI_FORMATS, openai_done_event, render_openai

    # the golden result lost 50.6 s of its 109.5 s of detected speech (3600-3650 s has no text)
    want = {"finish_reason": "stop", "incomplete": True, "coverage": 0.4638, "warnings": [],
            "incomplete_reason": "50.6 s of the detected speech (54%) has no transcribed text"}
    for fmt in ("json", "verbose_json", "diarized_json"):
        body, media_type, headers = render_openai(t, fmt)
        data = json.loads(body)
        assert media_type == "application/json"
        assert {k: data[k] for k in want} == want, fmt
    assert json.loads(render_openai(t, "json")[0])["text"] == t.text  # OpenAI's own fields stay
    done = openai_done_event(t)
    assert done["type"] == "transcript.text.done" and done["text"] == t.text
    assert {k: done[k] for k in want} == want
    for fmt in OPENAI_FORMATS:
        headers = render_openai(t, fmt)[2]
        assert headers == {"X-Diarist-Finish-Reason": "stop", "X-Diarist-Incomplete": "true",
                           "X-Diarist-Coverage": "0.4638"}
    with pytest.raises(ValueError, match="response_format"):
        render_openai(t, "rttm")


def test_openai_fields_of_a_budget_stop_and_a_warning():
    from diarist.formats import render_openai

    t = Transcript.from_engine_json({"duration": 20.0, "model": "m", "finish_reason": "length", "metrics": {}, "speech": [[0, 20]],
                                "segments": [{"speaker": 0, "start": 0.0, "end": 5.0, "text": "cut"}],
                                "warnings": [{"code": "invalid_samples", "count": 3, "message": "3 replaced"}]})
    data = json.loads(render_openai(t, "verbose_json")[0])
    assert (data["finish_reason"], data["incomplete"], data["coverage"]) == ("length", True, 0.25)
    assert "budget" in data["incomplete_reason"]
    assert data["warnings"] == [{"code": "invalid_samples", "message": "3 replaced", "count": 3}]


def test_timestamp_granularities_pick_verbose_jsons_lists_or_are_refused(t):
    """OpenAI ``timestamp_granularities[]`` (issue 33 item 20): honoured in verbose_json, refused with a code
    otherwise (an unknown value, another response_format, words from a model that times segments only)."""
    from diarist.contract.errors import InvalidRequest
    from diarist.formats import render_openai, timestamp_granularities

    assert timestamp_granularities(None, "json", "whisper") is None
    assert timestamp_granularities(["segment", "word", "word"], "verbose_json", "whisper") == ("word", "segment")
    for values, fmt, family, code, says in (
            (["char"], "verbose_json", "whisper", "invalid_request", "'char' is not one of word, segment"),
            (["word"], "json", "whisper", "invalid_request", "verbose_json only"),
            (["word"], "verbose_json", "moss-td", "unsupported_granularity", "times segments, not words")):
        with pytest.raises(InvalidRequest, match=says) as e:
            timestamp_granularities(values, fmt, family)
        assert (e.value.code, e.value.status) == (code, 422)
    assert timestamp_granularities(["segment"], "verbose_json", "moss-td") == ("segment",)
    words = json.loads(render_openai(t, "verbose_json", ("word",))[0])
    assert "segments" not in words and len(words["words"]) == sum(len(s.words) for s in t.segments) > 0
    segments = json.loads(render_openai(t, "verbose_json", ("segment",))[0])
    assert "words" not in segments and len(segments["segments"]) == len(t.segments)
    both = json.loads(render_openai(t, "verbose_json", ("word", "segment"))[0])
    assert both["words"] == words["words"] and both["segments"] == segments["segments"]
    assert json.loads(render_openai(t, "verbose_json")[0]) == both  # nothing asked: as before
