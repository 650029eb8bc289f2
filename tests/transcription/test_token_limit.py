"""A Whisper window that stops at its token budget (``max_new_tokens``, finish ``length``) without repeating
is reported as truncated (flag and warning ``max_new_tokens``), not as a decoding loop, and is not decoded
again: on tiny.en and a real recording."""

from __future__ import annotations

from tests.conftest import data_file
from transcription.decode_quality import LOOP, TRUNCATED
from transcription.transcriber import TranscribeOptions, Transcriber


def test_a_window_cut_at_the_token_limit_is_truncated_not_a_loop(whisper_engine):
    r = Transcriber(whisper_engine).transcribe(data_file("en_jfk_inaugural/jfk.flac"),
                                               TranscribeOptions(diarize=False, max_new_tokens=3))
    assert r.windows and all(w["flag"] == TRUNCATED and w["status"] == "ok" for w in r.windows), r.windows
    assert all(w["attempts"] == 1 for w in r.windows)  # no temperature fallback: it would stop there again
    assert r.finish_reason == "length"
    assert r.incomplete and "token limit (max_new_tokens 3)" in r.incomplete_reason
    assert "loop" not in r.incomplete_reason
    assert [w["code"] for w in r.warnings] == [TRUNCATED]
    assert r.warnings[0]["count"] == len(r.windows)
    assert r.segments and all(s.flags == [TRUNCATED] for s in r.segments)
    assert not any(LOOP in (s.flags or []) for s in r.segments)


def test_a_window_that_ends_in_time_has_no_truncation_warning(whisper_engine):
    r = Transcriber(whisper_engine).transcribe(data_file("en_jfk_inaugural/jfk.flac"),
                                               TranscribeOptions(diarize=False))
    assert r.finish_reason == "stop" and not r.incomplete
    assert all(w["flag"] is None for w in r.windows)
    assert TRUNCATED not in [w["code"] for w in r.warnings]


def test_a_budget_too_small_for_one_segment_is_incomplete_not_silence(whisper_engine):
    """One token is not enough for a segment: no segments, but the window heard speech, so the result is
    incomplete and not ``no_speech`` (a clip full of speech is not reported as silent)."""
    r = Transcriber(whisper_engine).transcribe(data_file("en_jfk_inaugural/jfk.flac"),
                                               TranscribeOptions(diarize=False, max_new_tokens=1))
    assert not r.segments and r.incomplete
    assert r.no_speech is False
