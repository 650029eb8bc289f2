"""The whole cascade on the demo recording: Whisper window ▸ word alignment ▸ VAD ▸ diarize ▸ assign."""

from __future__ import annotations

from tests.conftest import data_file, decode_and_align
from transcription.audio.vad import detect_speech
from transcription.diarization import assign_speakers, diarize
from transcription.whisper.decoding import split_segments


def test_demo_recording_speakers_follow_the_reference(whisper_engine):
    eng = whisper_engine
    wave, seq, words, tt, frames = decode_and_align(eng, "en_2spk_phonecall_pyannote_sample/sample.wav", 440)
    segments = [{"start": s.start, "end": s.end, "text": eng.tokenizer.decode(s.token_ids),
                 "words": [w for w in words if w["segment"] == i]}
                for i, s in enumerate(split_segments(tt, seq.output_ids, frames / 100))]
    out = assign_speakers(segments, diarize(wave, detect_speech(wave)))

    assert {o["speaker"] for o in out} == {0, 1}
    assert all(o["start"] <= o["end"] for o in out)
    assert all(w["speaker"] == o["speaker"] for o in out for w in o["words"])

    def speaker_of(name):  # sample.stm: Diane introduces herself at 12.5 s, Sheila at 14.4 s
        return next(w["speaker"] for o in out for w in o["words"] if name in w["word"])

    assert speaker_of("Diane") != speaker_of("Sheila")


def test_whisper_result_carries_the_diarization_turns(whisper_engine):
    from diarist.transcript import Transcript
    from transcription.transcriber import TranscribeOptions, Transcriber

    result = Transcriber(whisper_engine).transcribe(
        data_file("en_2spk_phonecall_pyannote_sample/sample.wav"), TranscribeOptions(diarize=True))
    turns = result.turns
    assert {t["speaker"] for t in turns} == {s.speaker for s in result.segments} == {0, 1}
    assert all(0 <= t["start"] < t["end"] <= result.duration for t in turns)
    t = Transcript.from_engine(result)
    assert t.turns is not None and {x.speaker for x in t.turns} == set(t.speakers) == {"S01", "S02"}


def test_num_speakers_is_honoured_in_the_transcript(whisper_engine):
    """The issue's report: ``num_speakers=2`` on dev00 (2 talkers) gave 1 speaker. The transcript's speaker
    list (what the job's ``num_speakers`` reports) must hold 2, and both must carry words."""
    from diarist.transcript import Transcript
    from transcription.transcriber import TranscribeOptions, Transcriber

    result = Transcriber(whisper_engine).transcribe(
        data_file("en_ami_meeting_dev00_2spk/dev00.wav"), TranscribeOptions(diarize=True, num_speakers=2))
    t = Transcript.from_engine(result)
    assert len(t.speakers) == 2
    assert {s.speaker for s in t.segments if s.text.strip()} == set(t.speakers)
