"""No text on music, animal sounds, effects and noise: the VAD and the model's no-speech probability
together, on the non-speech items of the shared data."""

from __future__ import annotations

import pytest

from tests.conftest import data_file
from transcription.transcriber import TranscribeOptions, Transcriber

NON_SPEECH = [
    "music_brahms_hungarian_dance5_ogg/Hungarian_Dance_number_5_-_Allegro_in_F_sharp_minor_(string_orchestra).ogg",
    "nonspeech_humpback_whale_ogg/glacier-bay-humpback.ogg",
    "nonspeech_mp4_aac_5.1_bigbuckbunny/big_buck_bunny_small.mp4",
    "noise_stationary_picovoice_empty/empty.wav",
    "silence_and_noise_1s_tflite/noise_1000ms.wav",
    "silence_and_noise_1s_tflite/silence_1000ms.wav",
]


@pytest.fixture(scope="module")
def tr(whisper_engine):
    return Transcriber(whisper_engine)


@pytest.mark.slow
@pytest.mark.parametrize("rel", NON_SPEECH)
def test_non_speech_gives_no_text(tr, rel):
    assert data_file(rel).with_suffix(".txt").read_text().strip() == ""  # the reference: no speech
    r = tr.transcribe(data_file(rel), TranscribeOptions(diarize=False))
    assert r.segments == [] and r.no_speech is True and r.finish_reason == "stop"
    assert not r.incomplete
    # a window the VAD let through is dropped only as silence (model and VAD both in doubt)
    assert all(w["status"] == "no_speech" for w in r.windows)


@pytest.mark.slow
def test_effects_the_vad_passes_are_dropped_by_the_no_speech_rule(tr):
    """Big Buck Bunny's effects pass the VAD (a 2.7 s region) and tiny.en writes "Mmm." for them with a
    fair log-probability; the model's no-speech probability and the VAD's doubt drop it."""
    r = tr.transcribe(data_file(NON_SPEECH[2]), TranscribeOptions(diarize=False))
    (w,) = r.windows
    assert w["status"] == "no_speech" and w["no_speech_prob"] > 0.6 and w["vad_confidence"] < 0.8
    assert w["avg_logprob"] > -1.0  # the reference decoder's rule alone would have kept the text
