"""Result building (transcription.result) without an engine: the multichannel merge and the last fields."""

from __future__ import annotations

from diarist.contract.result import check_result
from transcription.language import LanguageChoice
from transcription.result import (
    FEWER_SPEAKERS,
    finish_result,
    merge_channels,
    speaker_hint_warnings,
    whisper_result,
)


def _channel(segments, finish="stop", language=None, incomplete_reason=None, queue_wait_s=0.5, speech=((0.0, 2.0),)):
    r = whisper_result("tiny.en", 4.0, segments, finish, {"vad_s": 0.25, "decode_s": 1.0, "output_tokens": 10,
                                                          "queue_wait_s": queue_wait_s},
                       no_speech=not segments, language=LanguageChoice(language, "detected" if language else None),
                       speech=list(speech))
    r["windows"] = [{"start": 0.0, "end": 2.0, "status": "ok"}]
    if incomplete_reason:
        r["incomplete_reason"] = incomplete_reason
    return r


def test_channels_merge_in_time_order_with_summed_metrics_and_the_first_language():
    left = _channel([{"start": 2.0, "end": 3.0, "text": "later"}], queue_wait_s=0.25)
    right = _channel([{"start": 0.5, "end": 1.0, "text": "first"}], finish="length", language="de",
                     incomplete_reason="the budget ran out", speech=((2.0, 3.5),))
    out = merge_channels("tiny.en", [left, right], frames=64_000, sample_rate=16_000)
    assert [(s["text"], s["speaker"], s["channel"]) for s in out["segments"]] == [("first", "CH2", 1),
                                                                                  ("later", "CH1", 0)]
    assert out["duration"] == 4.0 and out["finish_reason"] == "length"
    assert (out["language"], out["language_source"]) == ("de", "detected")
    assert out["metrics"] == {"vad_s": 0.5, "encoder_s": 0, "prefill_s": 0, "decode_s": 2.0, "prompt_tokens": 0,
                              "output_tokens": 20, "queue_wait_s": 0.5, "diarization_s": 0.0, "channels": 2}
    assert out["speech"] == [[0.0, 2.0], [2.0, 3.5]]
    assert [w["channel"] for w in out["windows"]] == [0, 1]
    assert out["incomplete"] and out["incomplete_reason"] == "channel 2: the budget ran out"
    assert check_result(out) is out


def test_finish_result_sets_the_timings_warnings_and_the_completeness_verdict():
    r = _channel([{"start": 0.0, "end": 2.0, "text": "all of it"}])
    r["warnings"] = [{"code": "pipeline", "message": "p"}]
    decoder = [{"code": "invalid_samples", "message": "3 replaced", "count": 3}]
    out = finish_result(r, 4.0, processing_s=2.0, audio_decode_s=0.125, warnings=decoder, random_weights=True)
    assert out is r
    assert (out["metrics"]["processing_s"], out["metrics"]["audio_decode_s"], out["metrics"]["rtf"]) == (2.0, 0.125,
                                                                                                          0.5)
    assert [w["code"] for w in out["warnings"]] == ["invalid_samples", "pipeline"]
    assert out["random_weights"] is True and out["coverage"] == 1.0 and out["incomplete"] is False
    empty = finish_result(_channel([], speech=()), 0.0, 0.1, 0.0, [], random_weights=False)
    assert empty["metrics"]["rtf"] is None and "random_weights" not in empty


def test_fewer_speakers_than_asked_is_a_warning_with_the_count_found():
    segs = [{"start": 0.0, "end": 1.0, "text": "a", "speaker": "S01"}, {"start": 1.0, "end": 2.0, "text": "b",
                                                                         "speaker": "S01"}]
    r = _channel(segs)
    (w,) = speaker_hint_warnings(r, num_speakers=64, min_speakers=None)
    assert (w["code"], w["count"]) == (FEWER_SPEAKERS, 1) and "num_speakers=64" in w["message"]
    (w,) = speaker_hint_warnings(r, num_speakers=None, min_speakers=2)
    assert w["count"] == 1 and "min_speakers=2" in w["message"]
    assert speaker_hint_warnings(r, num_speakers=1, min_speakers=None) == []  # met
    assert speaker_hint_warnings(r, num_speakers=None, min_speakers=None) == []  # no hint
    assert speaker_hint_warnings(_channel(segs, finish="abort"), num_speakers=3, min_speakers=None) == []
    # a speaker with turns but no words is one of the transcript's speakers too (Transcript.speakers)
    r["turns"] = [{"start": 0.0, "end": 1.0, "speaker": "S01"}, {"start": 1.0, "end": 1.1, "speaker": "S02"}]
    assert speaker_hint_warnings(r, num_speakers=2, min_speakers=None) == []
    assert speaker_hint_warnings(r, num_speakers=3, min_speakers=None)[0]["count"] == 2
