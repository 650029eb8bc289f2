"""One talker per channel: the stereo clip is transcribed per channel and labelled by channel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine import Sequence
from tests.conftest import data_file
from transcription.audio import decode_audio, log_mel_spectrogram
from transcription.audio.vad import detect_speech
from transcription.diarization import channel_turns, distinct_channels, label_channels
from transcription.whisper.decoding import (
    WhisperTimestampRules,
    WhisperTokens,
    split_segments,
    whisper_prompt,
)

STEREO = "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization"


def _transcribe(eng, waves):
    info = eng.loaded.info["config"]
    tt = WhisperTokens.from_vocab(eng.model.config.vocab_size)
    rules = WhisperTimestampRules(tt, info["suppress_ids"], info["suppress_ids_begin"])
    seqs = [Sequence(prompt_ids=whisper_prompt(tt), max_new_tokens=200, stop_token_ids=(tt.eot,),
                     mm_inputs={"mel": log_mel_spectrogram(torch.from_numpy(w))[0]}, logits_processor=rules)
            for w in waves]
    eng.generate(seqs)
    return [[{"start": s.start, "end": s.end, "text": eng.tokenizer.decode(s.token_ids)}
             for s in split_segments(tt, q.output_ids, math.ceil(len(w) / 160) / 100)] for q, w in zip(seqs, waves,
                                                                                                 strict=True)]


def _words(text):
    return "".join(c for c in text.lower() if c.isalpha() or c.isspace()).split()


def test_stereo_clip_is_labelled_by_channel(whisper_engine):
    jiwer = pytest.importorskip("jiwer")
    audio = decode_audio(data_file(STEREO + ".wav"), mono=False)
    assert audio.samples.shape[0] == 2 and distinct_channels(audio.samples)
    merged = label_channels(_transcribe(whisper_engine, list(audio.samples)))
    assert [s["start"] for s in merged] == sorted(s["start"] for s in merged)
    for ch, ref_file in ((0, ".ch1_left.txt"), (1, ".ch2_right.txt")):
        hyp = " ".join(s["text"] for s in merged if s["speaker"] == ch)
        ref = data_file(STEREO + ref_file).read_text()
        assert jiwer.wer(" ".join(_words(ref)), " ".join(_words(hyp))) <= 0.2, (ch, hyp)


def test_stereo_turns_against_the_rttm():
    metrics = pytest.importorskip("pyannote.metrics.diarization")
    core = pytest.importorskip("pyannote.core")
    audio = decode_audio(data_file(STEREO + ".wav"), mono=False)
    turns = channel_turns([detect_speech(c) for c in audio.samples])
    assert {t.speaker for t in turns} == {0, 1}
    hyp, ref = core.Annotation(), core.Annotation()
    for t in turns:
        hyp[core.Segment(t.start, t.end)] = t.speaker
    for line in data_file(STEREO + ".rttm").read_text().splitlines():
        f = line.split()
        ref[core.Segment(float(f[3]), float(f[3]) + float(f[4]))] = f[7]
    # the RTTM was derived by per-channel energy (+-0.2 s), and both talkers overlap: both are kept
    uem = core.Timeline([core.Segment(0.0, audio.duration)])
    assert metrics.DiarizationErrorRate(collar=0.25)(ref, hyp, uem=uem) <= 0.10


def test_copies_of_one_mix_are_not_distinct_channels():
    jfk = decode_audio(data_file("en_jfk_inaugural/jfk.flac"), mono=False).samples  # stereo, same speech
    assert jfk.shape[0] == 2 and not distinct_channels(jfk)
    assert not distinct_channels(np.zeros((2, 1600), np.float32))
    assert not distinct_channels(jfk[:1])


def test_label_channels_keeps_words_and_channels():
    a = [{"start": 1.0, "end": 2.0, "text": "a", "words": [{"word": " a", "start": 1.0, "end": 2.0}]}]
    b = [{"start": 0.5, "end": 1.5, "text": "b"}]
    out = label_channels([a, b])
    assert [(s["text"], s["speaker"], s["channel"]) for s in out] == [("b", 1, 1), ("a", 0, 0)]
    assert out[1]["words"][0]["speaker"] == 0
