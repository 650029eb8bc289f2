"""MOSS-TD output parser: documented examples, malformed output, and property tests."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from transcription.moss_td.parser import parse_moss_td, render_moss_td


def seg(speaker, start, end, text):
    return {"speaker": speaker, "start": start, "end": end, "text": text}


def test_canonical_example_from_the_notes():
    out = parse_moss_td("[0.52][S01]Morning, shall we start?[2.31][2.90][S02]Yes, the figures are ready."
                        "[5.04][5.40][S01]Great.[5.92]")
    assert out == [
        seg("S01", 0.52, 2.31, "Morning, shall we start?"),
        seg("S02", 2.90, 5.04, "Yes, the figures are ready."),
        seg("S01", 5.40, 5.92, "Great."),
    ]


def test_bracketed_number_inside_text_stays_text():
    assert parse_moss_td("[1.00][S01]第[2024]年的计划[3.50]") == [seg("S01", 1.0, 3.5, "第[2024]年的计划")]
    assert parse_moss_td("[1.00][S01]room [12] is free[3.50]") == [seg("S01", 1.0, 3.5, "room [12] is free")]


def test_unknown_tags_are_kept_in_text():
    assert parse_moss_td("[0.00][S01][laugh] yes [noise]ok[1.20]") == [seg("S01", 0.0, 1.2, "[laugh] yes [noise]ok")]


def test_text_before_first_header_is_ignored():
    assert parse_moss_td("assistant: here you go [7] [0.50][S02]hi[1.00]") == [seg("S02", 0.5, 1.0, "hi")]


def test_whitespace_between_time_and_speaker_and_between_segments():
    out = parse_moss_td("[0.50] [S01]a[1.00]\n[1.50]\t[S02]b[2.00]\n")
    assert out == [seg("S01", 0.5, 1.0, "a"), seg("S02", 1.5, 2.0, "b")]


def test_missing_end_is_none_and_next_header_still_starts_a_segment():
    out = parse_moss_td("[0.50][S01]first[1.50][S02]second[2.50]")
    assert out == [seg("S01", 0.5, None, "first"), seg("S02", 1.5, 2.5, "second")]


def test_truncated_tail_variants():
    assert parse_moss_td("[0.50][S01]cut here") == [seg("S01", 0.5, None, "cut here")]
    assert parse_moss_td("[0.50][S01]cut here[3.") == [seg("S01", 0.5, None, "cut here")]
    assert parse_moss_td("[0.50][S01]a[1.00][1.20][S0") == [seg("S01", 0.5, 1.0, "a")]
    assert parse_moss_td("[0.50][S01]a[1.00][1.2") == [seg("S01", 0.5, 1.0, "a")]
    # an unterminated bracket that is not a time/speaker fragment is text
    assert parse_moss_td("[0.50][S01]a [see") == [seg("S01", 0.5, None, "a [see")]


def test_end_before_start_is_dropped_not_trusted():
    assert parse_moss_td("[5.00][S01]a[4.00][6.00][S02]b[7.00]") == [
        seg("S01", 5.0, None, "a"), seg("S02", 6.0, 7.0, "b")]


def test_speaker_tag_without_time_starts_at_last_known_time():
    assert parse_moss_td("[1.00][S01]a[S02]b[3.00]") == [seg("S01", 1.0, None, "a"), seg("S02", 1.0, 3.0, "b")]
    assert parse_moss_td("[1.00][S01]a[2.00][laugh][S02]b[3.00]") == [
        seg("S01", 1.0, 2.0, "a[laugh]"), seg("S02", 2.0, 3.0, "b")]


def test_speaker_labels_are_normalised_and_empty_segments_dropped():
    assert parse_moss_td("[0.00][S1]  [1.00][2.00][s003]x[3.00]") == [seg("S03", 2.0, 3.0, "x")]


def test_degenerate_inputs():
    for s in ["", "[", "]", "[]", "[[[]]]", "[S01]", "[0.5]", "no tags at all", "[1.2.3][S01]x"]:
        assert isinstance(parse_moss_td(s), list)
    assert parse_moss_td("[1.2.3][S01]x[2]") == [seg("S01", 0.0, 2.0, "x")]


# --- property tests -------------------------------------------------------------------------

_NOISY = st.lists(st.sampled_from(list("[]S0123456789. \nab第年s-") + ["[S01]", "[0.5]", "[laugh]"]),
                  max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=200), _NOISY))
def test_any_string_parses_without_exception_and_output_is_valid(s):
    out = parse_moss_td(s)
    for d in out:
        assert set(d) == {"speaker", "start", "end", "text"}
        assert re.fullmatch(r"S\d{2,}", d["speaker"])
        assert isinstance(d["start"], float) and d["start"] >= 0
        assert d["end"] is None or d["end"] >= d["start"]
        assert d["text"] and d["text"] == d["text"].strip()


_WORD = st.text(alphabet=st.characters(blacklist_characters="[]", blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
                min_size=1, max_size=8)
_INNER_TAG = st.sampled_from(["[laugh]", "[noise]", "[2024]", "[7]", "[1.5]"])


@st.composite
def _segment_text(draw):
    # words separated by single spaces; a bracket tag inside must be followed by more text
    # (a trailing number would legitimately read as an end time)
    parts = [draw(_WORD)]
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            parts.append(draw(_INNER_TAG) + draw(_WORD))
        else:
            parts.append(draw(_WORD))
    text = " ".join(parts)
    if draw(st.booleans()):
        text = draw(st.sampled_from(["[laugh]", "[2024]"])) + text
    return text


@st.composite
def _segments(draw):
    out = []
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, 600_000)) / 100
        end = draw(st.integers(round(start * 100), round(start * 100) + 3_000)) / 100
        spk = f"S{draw(st.integers(1, 12)):02d}"
        out.append(seg(spk, start, end, draw(_segment_text())))
    return out


@settings(max_examples=300, deadline=None)
@given(_segments())
def test_well_formed_rendering_round_trips(segments):
    assert parse_moss_td(render_moss_td(segments)) == segments


@settings(max_examples=200, deadline=None)
@given(_segments(), st.integers(0, 400))
def test_truncating_a_rendering_never_invents_segments(segments, cut):
    rendered = render_moss_td(segments)
    out = parse_moss_td(rendered[:cut])
    assert len(out) <= len(segments)
    for got, want in zip(out, segments):
        assert got["speaker"] == want["speaker"] and got["start"] == want["start"]
        assert want["text"].startswith(got["text"])
