"""The whole Whisper cascade on real recordings: accuracy, speakers, no-speech inputs, bad input."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from tests.conftest import data_file, pcm16_wav, wav_bytes
from transcription.audio import AudioError
from transcription.errors import Rejected
from transcription.limits import MIN_DURATION_S
from transcription.transcriber import TranscribeOptions, Transcriber
from transcription.whisper.align import MIN_WORD_S

jiwer = pytest.importorskip("jiwer")


def norm(text: str) -> str:
    """Lowercase, punctuation removed, whitespace collapsed (the WER normalisation of the issue)."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


@pytest.fixture(scope="module")
def tr(whisper_engine):
    return Transcriber(whisper_engine)


@pytest.mark.slow
def test_jfk_wer_at_most_5_percent(tr):
    r = tr.transcribe(data_file("en_jfk_inaugural/jfk.flac"))
    ref = data_file("en_jfk_inaugural/jfk.txt").read_text()
    hyp = " ".join(s.text for s in r.segments)
    assert jiwer.wer(norm(ref), norm(hyp)) <= 0.05
    assert len({s.speaker for s in r.segments}) == 1
    assert r.finish_reason == "stop" and not r.no_speech and not r.incomplete
    assert all(0 <= s.start <= s.end <= r.duration for s in r.segments)


@pytest.mark.slow
def test_demo_recording_two_speakers_and_wer(tr):
    r = tr.transcribe(data_file("en_2spk_phonecall_pyannote_sample/sample.wav"))
    ref = data_file("en_2spk_phonecall_pyannote_sample/sample.txt").read_text()
    hyp = " ".join(s.text for s in r.segments)
    assert len({s.speaker for s in r.segments}) == 2
    assert jiwer.wer(norm(ref), norm(hyp)) <= 0.40
    starts = [s.start for s in r.segments]
    assert r.segments and max(s.end for s in r.segments) <= 30.0
    assert len(starts) >= 5
    # no zero-length words, before or after the speaker assignment trims pieces (issue 33 item 21)
    for seg in r.segments:
        words = seg.words or []
        assert all(w.end - w.start >= MIN_WORD_S - 1e-6 for w in words), seg
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(words)), seg


@pytest.mark.parametrize("clip", ["30ms", "3_samples"])
def test_a_clip_shorter_than_the_documented_minimum_is_too_short(tr, clip):
    audio = data_file("en_short_yes/yes_30ms.wav") if clip == "30ms" else pcm16_wav(np.full(3, 1000, np.int16))
    with pytest.raises(Rejected) as e:
        tr.transcribe(audio)
    assert e.value.code == "too_short" and f"minimum is {MIN_DURATION_S:g} s" in e.value.message


@pytest.mark.parametrize("rel", [
    "silence_and_noise_1s_tflite/silence_1000ms.wav",
    "noise_stationary_picovoice_empty/empty.wav",
])
def test_tiny_and_no_speech_inputs_give_an_empty_transcript(tr, rel):
    r = tr.transcribe(data_file(rel))
    assert r.segments == [] and r.no_speech is True and r.finish_reason == "stop"
    assert r.turns == []  # the speaker cascade's answer, as docs/service.md says: nobody spoke


def test_digital_silence_gives_no_speech(tr):
    r = tr.transcribe(wav_bytes(5.0))
    assert r.segments == [] and r.no_speech is True and r.finish_reason == "stop"


@pytest.mark.parametrize("payload,code", [(b"", "decode_failed"), (b"hello, not audio at all\n" * 10, "decode_failed")])
def test_bad_bytes_raise_audio_error_with_code(tr, payload, code):
    with pytest.raises(AudioError) as e:
        tr.transcribe(payload)
    assert e.value.code in (code, "empty_audio")


@pytest.mark.slow
def test_multichannel_labels_by_channel(tr):
    r = tr.transcribe(data_file("en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav"),
                      TranscribeOptions(multichannel=True))
    assert {s.speaker for s in r.segments} == {"CH1", "CH2"}
    left = " ".join(s.text for s in r.segments if s.speaker == "CH1")
    ref = data_file("en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.ch1_left.txt").read_text()
    assert jiwer.wer(norm(ref), norm(left)) <= 0.2


def test_cancel_aborts_the_recording_and_frees_its_kv(tr, whisper_engine):
    steps = whisper_engine.counters["steps"]

    def should_cancel():
        return whisper_engine.counters["steps"] > steps + 2  # mid-decode: the engine has stepped the windows

    r = tr.transcribe(data_file("en_2spk_phonecall_pyannote_sample/sample.wav"), TranscribeOptions(diarize=False),
                      should_cancel=should_cancel)
    assert r.finish_reason == "abort" and r.incomplete is True
    e = whisper_engine
    assert e.allocator.num_free == e.allocator.num_slots and e.table.num_free == e.table.max_reqs



def test_cancel_before_the_windows_are_submitted_sends_nothing_to_the_engine(tr, whisper_engine):
    steps = whisper_engine.counters["steps"]
    r = tr.transcribe(data_file("en_jfk_inaugural/jfk.flac"), should_cancel=lambda: True)
    assert r.finish_reason == "abort" and r.incomplete is True and r.segments == []
    # the VAD stopped at its first block (tests/transcription/audio/test_vad_cancel.py): no window was made
    assert r.no_speech is False and r.pipeline_metrics["windows"] == 0
    assert r.metrics.prompt_tokens == 0 and whisper_engine.counters["steps"] == steps

def test_window_budget_follows_duration_and_the_context_clamps_it(whisper_engine):
    from engine import Sequence
    from transcription.options import window_budget

    assert window_budget(1.0) == 64 and window_budget(12.0) == 120 and window_budget(30.0) == 300
    s = Sequence(prompt_ids=[50257] * 200, max_new_tokens=window_budget(30.0))
    whisper_engine.scheduler.validate(s)
    assert s.max_new_tokens == 448 - 200


def test_english_only_model_refuses_other_languages(tr, whisper_engine):
    """tiny.en asked for Chinese would write English-sounding text labelled ``en``; it refuses before any
    work, and English however spelled is accepted."""
    from engine.request import RequestRejected

    steps = whisper_engine.counters["steps"]
    with pytest.raises(RequestRejected) as e:
        tr.transcribe(b"not even audio", TranscribeOptions(language="zh"))
    assert e.value.code == "unsupported_language" and "'zh'" in e.value.message
    assert whisper_engine.counters["steps"] == steps
    r = tr.transcribe(data_file("en_short_yes/yes_1000ms.wav"), TranscribeOptions(language="EN"))
    assert r.language == "en"


def test_stages_are_announced_in_order_before_their_work(tr):
    """``stage`` events name each stage as it begins (decode, speech detection, transcription, speakers), in
    the pipeline's order, each once; the duration (``queued``) comes after the decode and before the engine."""
    from diarist.contract.events import STAGES

    events: list[tuple[str, dict]] = []
    r = tr.transcribe(data_file("en_jfk_inaugural/jfk.flac"), on_event=lambda k, p: events.append((k, p)))
    kinds = [k for k, _ in events]
    assert [p["stage"] for k, p in events if k == "stage"] == list(STAGES)
    assert kinds.index("queued") == 1 and kinds[0] == "stage"
    assert kinds.index("segment") > kinds.index("stage", 3)  # segments stream during transcription
    assert kinds[-1] == "finished" and r.segments
