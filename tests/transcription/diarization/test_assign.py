"""Assignment of words and segments to speaker turns, with splits at word boundaries."""

from __future__ import annotations

from transcription.diarization import Turn, assign_speakers


def _w(word, s, e):
    return {"word": word, "start": s, "end": e}


TURNS = [Turn(0.0, 2.0, 0), Turn(2.0, 4.0, 1), Turn(5.0, 6.0, 0)]


def test_segment_split_where_the_speaker_changes():
    seg = {"id": 7, "start": 0.1, "end": 3.9, "text": " Hello there. Hi you.",
           "words": [_w(" Hello", 0.1, 0.6), _w(" there.", 0.6, 1.9), _w(" Hi", 2.1, 2.5), _w(" you.", 2.5, 3.9)]}
    out = assign_speakers([seg], TURNS)
    assert [(o["speaker"], o["text"], o["start"], o["end"]) for o in out] == [
        (0, "Hello there.", 0.1, 1.9), (1, "Hi you.", 2.1, 3.9)]
    assert all(o["id"] == 7 for o in out)  # other keys are carried
    assert [w["speaker"] for o in out for w in o["words"]] == [0, 0, 1, 1]


def test_pieces_never_end_before_they_start():
    # Whisper's segment end (9.0) before the aligned last word (9.64-9.9): the last piece spans the word
    seg = {"start": 8.0, "end": 9.0, "text": " you were there.",
           "words": [_w(" you", 8.0, 8.5), _w(" were", 8.5, 9.6), _w(" there.", 9.64, 9.9)]}
    turns = [Turn(7.0, 9.62, 0), Turn(9.62, 11.0, 1)]
    out = assign_speakers([seg], turns)
    assert [(o["speaker"], o["start"], o["end"]) for o in out] == [(0, 8.0, 9.6), (1, 9.64, 9.9)]


def test_word_goes_to_the_speaker_it_overlaps_most():
    seg = {"start": 1.5, "end": 2.8, "text": " across", "words": [_w(" across", 1.5, 2.8)]}
    assert assign_speakers([seg], TURNS)[0]["speaker"] == 1  # 0.5 s with speaker 0, 0.8 s with speaker 1


def test_word_in_a_gap_takes_the_nearest_turn():
    seg = {"start": 4.1, "end": 4.9, "text": " um", "words": [_w(" um", 4.7, 4.9)]}
    assert assign_speakers([seg], TURNS)[0]["speaker"] == 0  # 0.2 s from speaker 0's turn at 5.0


def test_segments_without_words_are_assigned_whole():
    segs = [{"start": 0.0, "end": 1.5, "text": "a"}, {"start": 2.5, "end": 4.5, "text": "b"}]
    out = assign_speakers(segs, TURNS)
    assert [o["speaker"] for o in out] == [0, 1] and [o["text"] for o in out] == ["a", "b"]


def test_no_turns_means_one_speaker():
    segs = [{"start": 0.0, "end": 1.0, "text": " x", "words": [_w(" x", 0.0, 1.0)]}, {"start": 1, "end": 2, "text": "y"}]
    out = assign_speakers(segs, [])
    assert [o["speaker"] for o in out] == [0, 0] and out[0]["words"][0]["speaker"] == 0
    assert assign_speakers([], TURNS) == []


def test_piece_is_trimmed_to_its_speakers_turns():
    # Whisper's segment starts at the window start (20.0) but the words and the turn start at 22.6
    seg = {"start": 20.0, "end": 24.0, "text": " On your marks",
           "words": [_w(" On", 22.5, 22.8), _w(" your", 22.8, 23.1), _w(" marks", 23.1, 24.0)]}
    out = assign_speakers([seg], [Turn(22.6, 23.8, 0), Turn(26.0, 28.0, 0)])
    assert [(o["start"], o["end"]) for o in out] == [(22.6, 23.8)]
    assert out[0]["words"][0]["start"] == 22.6 and out[0]["words"][-1]["end"] == 23.8


def test_trim_uses_the_turns_under_the_words_not_the_whole_segment():
    # a segment from 24.2 whose words start at 26.3: a turn ending at 24.3 must not stretch the piece back
    seg = {"start": 24.2, "end": 27.4, "text": " a long time",
           "words": [_w(" a", 26.3, 26.8), _w(" long", 26.8, 27.1), _w(" time", 27.1, 27.4)]}
    out = assign_speakers([seg], [Turn(23.1, 24.3, 0), Turn(26.6, 27.8, 0)])
    assert (out[0]["start"], out[0]["end"]) == (26.6, 27.4)


def test_overlap_tie_goes_to_the_segments_speaker():
    # speaker 1 holds 9.9-11.0; speaker 0 starts talking over her at 10.4; her last word falls in the overlap
    turns = [Turn(8.3, 9.9, 0), Turn(9.9, 11.0, 1), Turn(10.4, 14.7, 0)]
    seg = {"start": 10.1, "end": 10.9, "text": " neither did I",
           "words": [_w(" neither", 10.1, 10.4), _w(" did", 10.4, 10.6), _w(" I", 10.6, 10.9)]}
    out = assign_speakers([seg], turns)
    assert [o["speaker"] for o in out] == [1]


def test_words_in_overlap_keep_their_own_speaker_at_a_change_of_turn():
    # speaker 0 talks 0-3.0, speaker 1 from 2.0 (overlap 2.0-3.0); Whisper wrote both in one segment, in time
    # order: "we should stop here." (0's, the last two words in the overlap) then "yes I agree" (1's, the first
    # in the overlap). Before: the tied words all went to the segment's speaker 0 and 1's "yes" was fused in.
    turns = [Turn(0.0, 3.0, 0), Turn(2.0, 5.0, 1)]
    seg = {"start": 0.0, "end": 4.5, "text": " we should stop here. yes I agree",
           "words": [_w(" we", 0.2, 0.6), _w(" should", 0.6, 1.2), _w(" stop", 1.2, 2.1), _w(" here.", 2.1, 2.4),
                     _w(" yes", 2.5, 2.8), _w(" I", 3.1, 3.3), _w(" agree", 3.3, 4.5)]}
    out = assign_speakers([seg], turns)
    assert [(o["speaker"], o["text"]) for o in out] == [(0, "we should stop here."), (1, "yes I agree")]


def test_overlap_run_without_punctuation_is_cut_at_the_longest_pause():
    turns = [Turn(0.0, 3.0, 0), Turn(2.0, 5.0, 1)]
    seg = {"start": 0.0, "end": 4.5, "text": " a b c d e",
           "words": [_w(" a", 0.2, 1.95), _w(" b", 2.0, 2.2), _w(" c", 2.25, 2.4), _w(" d", 2.8, 2.95),
                     _w(" e", 3.2, 4.5)]}
    out = assign_speakers([seg], turns)
    assert [(o["speaker"], o["text"]) for o in out] == [(0, "a b c"), (1, "d e")]
