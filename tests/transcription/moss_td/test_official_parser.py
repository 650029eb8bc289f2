"""Our MOSS-TD parser against the official one (OpenMOSS ``transcript_parser.py``, Apache-2.0).

``OFFICIAL`` holds the official parser's test vectors with its expected segments. Where the official parser
drops text (an unterminated segment, text after an end time), ours keeps it and reports the repair; the
differences, and why, are listed in docs/moss_td.md ("Parsing").
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diarist.completeness import assess
from diarist.transcript import Transcript
from engine.loaders.moss_td import ASSET_TOKENIZER
from engine.request import FinishReason, Sequence
from engine.tokenizer import TextTokenizer
from transcription.moss_td.parser import MossParse, MossStreamParser, parse_moss_td, parse_moss_td_report
from transcription.moss_td.sequence import moss_result

# (input as the official tests chunk it, expected (start, end, speaker, text) segments)
OFFICIAL = [
    (["[0.48][S01]Welcome[1.66][12.26][S02]Ready[13.81]"],
     [(0.48, 1.66, "S01", "Welcome"), (12.26, 13.81, "S02", "Ready")]),
    (["[0.48][S01]你好[1.66][12.26][S02]可以开始[13.81]"],
     [(0.48, 1.66, "S01", "你好"), (12.26, 13.81, "S02", "可以开始")]),
    (["[0", ".48][", "S01]", "hello[", "1.66]", "[2.0][S02]", "bye", "[3.0]"],
     [(0.48, 1.66, "S01", "hello"), (2.0, 3.0, "S02", "bye")]),
    (["[0][S01]第[2024]年，编号[001]继续[4]"], [(0.0, 4.0, "S01", "第[2024]年，编号[001]继续")]),
    (["[0.0]單一說話者片段[2.0][2.0]下一段[3.0]"], [(0.0, 2.0, "S01", "單一說話者片段"), (2.0, 3.0, "S01", "下一段")]),
    (["[0.0]hel", "lo[1.0]", "[1.0]world[2.0]"], [(0.0, 1.0, "S01", "hello"), (1.0, 2.0, "S01", "world")]),
    (["noise [bad][0.1][S01]hello[0.9]"], [(0.1, 0.9, "S01", "hello")]),
    (["[0][S01]a[1]\n [2][S02]b[3]"], [(0.0, 1.0, "S01", "a"), (2.0, 3.0, "S02", "b")]),
]


def _tuples(segments):
    return [(s["start"], s["end"], s["speaker"], s["text"]) for s in segments]


@pytest.mark.parametrize(("chunks", "want"), OFFICIAL)
def test_official_vectors(chunks, want):
    assert _tuples(parse_moss_td("".join(chunks))) == want


def test_official_vectors_have_no_issues_except_ignored_noise():
    issues = [parse_moss_td_report("".join(c)).issues for c, _ in OFFICIAL]
    assert issues[6] == ["text before the first segment header was ignored: 'noise [bad]'"]
    assert all(not i for n, i in enumerate(issues) if n != 6)


@pytest.mark.parametrize(("tail", "kept", "issue"), [
    ("[2.90][S02]Yes, the figures", "Yes, the figures", "has no end time"),  # the official parser drops it
    ("[2.90][S02]Yes[laugh", "Yes[laugh", "has no end time"),
    ("[2.90][S02]Yes[3.", "Yes", "cut-off time or speaker tag '[3.'"),
    ("[2.90][S02]Yes[3.50] and more", "Yes[3.50] and more", "has no end time"),
])
def test_a_malformed_tail_keeps_its_text_and_marks_the_job_incomplete(tail, kept, issue):
    tok = TextTokenizer(ASSET_TOKENIZER)
    text = "[0.52][S01]Morning, shall we start?[2.31]" + tail
    seq = Sequence(prompt_ids=[1, 2], max_new_tokens=100, stop_token_ids=(151645,))
    seq.output_ids = tok.encode(text) + [151645]
    seq.finish_reason = FinishReason.STOP
    res = moss_result(seq, tok, 10.0)
    assert res["segments"][-1]["text"] == kept
    result = {"duration": 10.0, "segments": res["segments"], "finish_reason": "stop", "metrics": {},
              "family": "moss-td", "parse_issues": res["parse_issues"], "model": "m"}
    result.update(assess(result).fields())  # what the transcriber does at the end
    assert result["incomplete"] and issue in result["incomplete_reason"]
    assert result["incomplete_reason"].startswith("malformed model output: ")
    t = Transcript.from_engine_json(result)
    assert t.incomplete and issue in t.incomplete_reason and t.segments[-1].text == kept


def test_well_formed_output_is_not_marked():
    r = parse_moss_td_report("[0.52][S01]Morning.[2.31][2.90][S02]Yes.[5.04]")
    assert r.issues == [] and len(r.segments) == 2
    assert parse_moss_td_report("[0.52][S01]a[1.0][laugh] stray words").issues == [
        "text after the last segment's end time was kept in that segment"]


# -- item 6: parse-as-you-go --------------------------------------------------------------------------------
def _fed(text: str, sizes) -> tuple[list, MossParse]:
    p = MossStreamParser()
    live, i, k = [], 0, 0
    while i < len(text):
        n = sizes[k % len(sizes)] if sizes else 1
        live += p.feed(text[i : i + n])
        i, k = i + n, k + 1
    return live, p.close()


@pytest.mark.parametrize(("chunks", "want"), OFFICIAL)
def test_parse_as_you_go_one_character_at_a_time_equals_the_final_parse(chunks, want):
    text = "".join(chunks)
    live, closed = _fed(text, [1])
    assert closed == parse_moss_td_report(text) and _tuples(closed.segments) == want
    assert live == closed.segments[: len(live)] and len(live) == len(want) - 1  # all but the last, live
    live, closed = _fed(text, [len(c) for c in chunks])  # the official tests' own chunking
    assert closed == parse_moss_td_report(text)


_PIECES = st.sampled_from(["[", "]", "[S01]", "[S2]", "[0.5]", "[12.25]", "[3]", "[laugh]", "hi", " ", "第",
                           "[2024]年", "\n", "[1.", "S0", "x y", "[S01", "]["])


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=30), st.lists(st.integers(1, 7), min_size=1, max_size=5))
def test_parse_as_you_go_equals_the_final_parse_on_any_output(pieces, sizes):
    text = "".join(pieces)
    live, closed = _fed(text, sizes)
    full = parse_moss_td_report(text)
    assert closed == full
    assert live == full.segments[: len(live)]
