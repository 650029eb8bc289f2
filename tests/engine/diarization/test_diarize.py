"""The cascade on real recordings: DER (pyannote.metrics, collar 0.25 s, overlap scored) against the RTTMs
in the shared data, speaker counts, hints, and no speakers where there is no speech."""

from __future__ import annotations

import numpy as np
import pytest

from engine.audio import decode_audio
from engine.audio.vad import detect_speech
from engine.diarization import diarize
from tests.conftest import data_file

metrics = pytest.importorskip("pyannote.metrics.diarization")
core = pytest.importorskip("pyannote.core")

PHONE = "en_2spk_phonecall_pyannote_sample/sample"
AMI = ["en_ami_meeting_dev00_2spk/dev00", "en_ami_meeting_trn05_4spk/trn05", "en_ami_meeting_trn07_4spk/trn07"]


def _annotation(rows):
    ann = core.Annotation()
    for s, e, spk in rows:
        ann[core.Segment(s, e)] = spk
    return ann


def _reference(stem):
    rows = []
    for line in data_file(stem + ".rttm").read_text().splitlines():
        f = line.split()
        rows.append((float(f[3]), float(f[3]) + float(f[4]), f[7]))
    return _annotation(rows)


_cache: dict = {}


def _run(stem, **hints):
    key = (stem, tuple(sorted(hints.items())))
    if key not in _cache:
        wave = decode_audio(data_file(stem + ".wav")).mono
        speech = detect_speech(wave)
        _cache[key] = (wave, speech, diarize(wave, speech, **hints))
    return _cache[key]


def _der(stem, turns):
    hyp = _annotation([(t.start, t.end, t.speaker) for t in turns])
    uem = core.Timeline([core.Segment(0.0, 30.0)])  # every scored item is 30.000 s long (MANIFEST.md)
    return metrics.DiarizationErrorRate(collar=0.25)(_reference(stem), hyp, uem=uem)


def test_phone_call_two_speakers_and_der():
    _, speech, turns = _run(PHONE)
    assert len({t.speaker for t in turns}) == 2
    assert _der(PHONE, turns) <= 0.15  # measured 9.5%


def test_turns_are_sorted_inside_speech_and_numbered_by_appearance():
    wave, speech, turns = _run(PHONE)
    assert all(a.start <= b.start for a, b in zip(turns, turns[1:], strict=False))
    for spk in {t.speaker for t in turns}:  # one speaker's turns never overlap; two speakers' may
        own = [t for t in turns if t.speaker == spk]
        assert all(a.end <= b.start + 1e-9 for a, b in zip(own, own[1:], strict=False))
    assert all(any(s - 1e-6 <= t.start and t.end <= e + 1e-6 for s, e in speech) for t in turns)
    first = []
    for t in turns:
        if t.speaker not in first:
            first.append(t.speaker)
    assert first == list(range(len(first)))


def test_ami_excerpts_der_regression_bound():
    """Mean DER over the three AMI excerpts, measured 37.2% (dev00 21.6%, trn05 9.9%, trn07 80.0%); most
    of it is speech Silero does not hear in the far-field mix (docs/diarization.md). Guards against
    regressions; the 35% target is tracked by the xfail test below."""
    ders = [_der(stem, _run(stem)[2]) for stem in AMI]
    assert np.mean(ders) <= 0.40, ders


@pytest.mark.xfail(reason="target not reached: far-field speech missed by the VAD (docs/diarization.md)", strict=False)
def test_ami_excerpts_meet_the_35_percent_target():
    ders = [_der(stem, _run(stem)[2]) for stem in AMI]
    assert np.mean(ders) <= 0.35, ders


def test_speaker_count_within_one_on_two_speaker_items():
    for stem in (PHONE, AMI[0]):
        ref = len(_reference(stem).labels())
        assert abs(len({t.speaker for t in _run(stem)[2]}) - ref) <= 1, stem


@pytest.mark.xfail(reason="4-speaker AMI excerpts: minor speakers (0.4-1.8 s) are not found (docs/diarization.md)",
                   strict=False)
def test_speaker_count_within_one_on_four_speaker_items():
    for stem in AMI[1:]:
        ref = len(_reference(stem).labels())
        assert abs(len({t.speaker for t in _run(stem)[2]}) - ref) <= 1, stem


def test_hints_change_the_count():
    assert len({t.speaker for t in _run(PHONE, num_speakers=3)[2]}) == 3
    assert len({t.speaker for t in _run(PHONE, max_speakers=1)[2]}) == 1
    assert len({t.speaker for t in _run(PHONE, min_speakers=3)[2]}) >= 3
    wave, speech, _ = _run(PHONE)
    with pytest.raises(ValueError):
        diarize(wave, speech, min_speakers=3, max_speakers=2)


@pytest.mark.parametrize("rel", [
    "music_brahms_hungarian_dance5_ogg/Hungarian_Dance_number_5_-_Allegro_in_F_sharp_minor_(string_orchestra).ogg",
    "nonspeech_humpback_whale_ogg/glacier-bay-humpback.ogg",
    "noise_stationary_picovoice_empty/empty.wav",
    "silence_and_noise_1s_tflite/silence_1000ms.wav",
])
def test_no_speech_no_speakers(rel):
    wave = decode_audio(data_file(rel)).mono
    assert diarize(wave, detect_speech(wave)) == []


def test_degenerate_inputs():
    assert diarize(np.zeros(0, np.float32), []) == []
    assert diarize(np.zeros(480, np.float32), [(0.0, 0.03)]) == []  # 30 ms: shorter than any region we keep
    wave = decode_audio(data_file(PHONE + ".wav")).mono
    one = diarize(wave, [(8.0, 8.6)])  # a single short region gets one window and one speaker
    assert [(t.start, t.end, t.speaker) for t in one] == [(8.0, 8.6, 0)]
