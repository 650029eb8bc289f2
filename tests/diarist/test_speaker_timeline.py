"""The speaker timeline (diarist.speaker_timeline): lanes, names, bars, overlaps, and its SVG picture, parsed
back with the standard library's XML parser."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from diarist.formats import render
from diarist.speaker_timeline import Bar, SpeakerTimeline, clock, overlaps, tick_step, to_svg
from diarist.transcript import SpeakerTurn, Transcript

SVG = "{http://www.w3.org/2000/svg}"


def transcript(segments, turns=None, duration=20.0, **over) -> Transcript:
    return Transcript.from_engine_json({"duration": duration, "language": "en", "model": "m", "segments": segments,
                                        "turns": turns, "metrics": {}, "finish_reason": "stop", **over})


def seg(speaker, start, end, text="hi"):
    return {"speaker": speaker, "start": start, "end": end, "text": text}


def test_one_lane_per_speaker_in_order_of_appearance_and_unknown_last():
    t = transcript([seg(1, 0.0, 2.0, "a"), seg(0, 2.5, 4.0, "b"), seg(None, 5.0, 6.0, "c"), seg(1, 7.0, 9.0, "d")])
    tl = SpeakerTimeline.of(t)
    assert [(lane.speaker, lane.name) for lane in tl.lanes] == [("S01", "S01"), ("S02", "S02"), (None, "unknown")]
    assert len({lane.color for lane in tl.lanes}) == 3
    assert [(b.lane, b.start, b.end, b.text) for b in tl.bars] == [
        (0, 0.0, 2.0, "a"), (1, 2.5, 4.0, "b"), (2, 5.0, 6.0, "c"), (0, 7.0, 9.0, "d")]
    assert tl.overlaps == () and tl.turns == ()


def test_a_lane_is_named_when_the_transcript_knows_the_name():
    t = transcript([seg("left", 0.0, 2.0), seg("right", 2.0, 3.0)])  # channel labels are kept as names
    assert [(lane.speaker, lane.name) for lane in SpeakerTimeline.of(t).lanes] == [("S01", "left"), ("S02", "right")]
    # a transcript with known speakers (voice profiles): an identity's name wins, an unnamed one falls back
    from types import SimpleNamespace

    named = t.model_copy(update={"speaker_names": None})
    object.__setattr__(named, "identities", {"S01": SimpleNamespace(name="Alice"), "S02": SimpleNamespace(name=None)})
    assert [lane.name for lane in SpeakerTimeline.of(named).lanes] == ["Alice", "S02"]
    assert "Alice" in to_svg(named)


def test_overlaps_come_from_the_turns_when_the_transcript_has_them():
    turns = [{"speaker": 0, "start": 0.0, "end": 5.0}, {"speaker": 1, "start": 4.0, "end": 8.0},
             {"speaker": 0, "start": 7.5, "end": 9.0}, {"speaker": 1, "start": 9.0, "end": 10.0}]
    t = transcript([seg(0, 0.0, 4.0), seg(1, 4.2, 7.9), seg(0, 8.0, 9.0), seg(1, 9.0, 10.0)], turns=turns)
    tl = SpeakerTimeline.of(t)
    assert len(tl.turns) == 4
    assert tl.overlaps == ((4.0, 5.0), (7.5, 8.0))  # back to back at 9.0 is not an overlap


def test_overlap_sweep_merges_and_ignores_one_lane_overlapping_itself():
    spans = [Bar(0, 0, 10), Bar(0, 2, 4), Bar(1, 3, 5), Bar(2, 4, 6), Bar(1, 6, 6), Bar(1, 8, 12)]
    assert overlaps(spans) == ((3, 6), (8, 10))
    assert overlaps([Bar(0, 0, 3), Bar(1, 3, 4)]) == ()


def test_svg_is_well_formed_and_draws_lanes_bars_overlaps_and_axis():
    turns = [SpeakerTurn(speaker="S01", start=0.0, end=5.0), SpeakerTurn(speaker="S02", start=4.0, end=8.0)]
    t = transcript([seg(0, 0.0, 4.0, "a"), seg(1, 4.2, 8.0, "b & <script>alert(1)</script>")])
    t = t.model_copy(update={"turns": turns})
    body, media_type = render(t, "svg")
    assert media_type.startswith("image/svg+xml") and body == to_svg(t)
    root = ET.fromstring(body)  # well-formed: the text is escaped, so no markup of the segment gets in
    assert root.tag == SVG + "svg" and root.find(SVG + "script") is None
    assert "<script>" not in body and "&lt;script&gt;" in body
    texts = [e.text for e in root.iter(SVG + "text")]
    assert "S01" in texts and "S02" in texts and "overlap" in texts and "00:00" in texts
    titles = [e.text for e in root.iter(SVG + "title")]
    assert "S02 00:04.2–00:08.0: b & <script>alert(1)</script>" in titles  # the bar's text, unescaped by XML
    assert "overlap 00:04–00:05" in titles


def test_a_long_meeting_stays_small_and_every_segment_is_drawn():
    segments = [seg(i % 4, i * 5.4, i * 5.4 + 4.0, f"segment {i}") for i in range(1000)]  # 90 minutes
    t = transcript(segments, duration=5400.0)
    body = to_svg(t)
    root = ET.fromstring(body)
    bars = [e for e in root.iter(SVG + "rect") if e.find(SVG + "title") is not None]
    assert len(bars) == 1000 and all(float(b.get("width")) >= 1.0 for b in bars)
    assert len(body) < 400_000
    assert tick_step(5400.0) == 600 and [e.text for e in root.iter(SVG + "text")][-1] == "1:30:00"


def test_an_empty_transcript_says_no_speech():
    root = ET.fromstring(to_svg(transcript([])))
    assert "No speech" in [e.text for e in root.iter(SVG + "text")]


def test_clock():
    assert [clock(v) for v in (0, 59.9, 61, 3725.25)] == ["00:00", "00:59", "01:01", "1:02:05"]
    assert [clock(v, 1) for v in (5.46, 0.29, 3725.25)] == ["00:05.4", "00:00.2", "1:02:05.2"]
