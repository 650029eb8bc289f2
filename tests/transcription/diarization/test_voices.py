"""Voice vectors per speaker (transcription/diarization/voices.py) with the real CAM++ weights."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import data_file
from transcription.audio import SAMPLE_RATE, decode_audio
from transcription.diarization.voices import (
    MAX_SPEECH_S,
    _subtract,
    _windows,
    result_spans,
    sample_embedding,
    speaker_embeddings,
)


def _rttm(path) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        f = line.split()
        out.setdefault(f[7], []).append((float(f[3]), float(f[3]) + float(f[4])))
    return out


def test_spans_come_from_turns_else_from_segments():
    turns = [{"speaker": 0, "start": 0.0, "end": 2.0}, {"speaker": 1, "start": 2.0, "end": 3.0}]
    segs = [{"speaker": "S02", "start": 1.0, "end": 2.5, "text": "a"}, {"speaker": None, "start": 3, "end": 4},
            {"speaker": "S01", "start": 4.0, "end": None, "text": "b"}, {"speaker": "S02", "start": 5, "end": 6}]
    assert result_spans({"turns": turns, "segments": segs}, 10.0) == {0: [(0.0, 2.0)], 1: [(2.0, 3.0)]}
    # MOSS-TD: no turns, the segments' own labels; an unterminated segment runs to the next one's start
    assert result_spans({"turns": None, "segments": segs}, 10.0) == {"S02": [(1.0, 2.5), (5.0, 6.0)],
                                                                      "S01": [(4.0, 5.0)]}
    assert result_spans({"segments": segs[:3]}, 10.0)["S01"] == [(4.0, 10.0)]  # the last: to the end


def test_windows_are_solo_bounded_and_capped():
    assert _subtract([(0.0, 10.0)], [(2.0, 3.0), (9.0, 12.0)]) == [(0.0, 2.0), (3.0, 9.0)]
    wins = _windows([(0.0, 25.0), (30.0, 30.3), (40.0, 100.0)])
    assert all(0.5 <= b - a <= 10.0 for a, b in wins) and (30.0, 30.3) not in wins
    assert MAX_SPEECH_S <= sum(b - a for a, b in wins) < MAX_SPEECH_S + 10.0


def test_a_talker_is_closer_to_itself_than_to_the_other_talker():
    """The phone call: each talker's first-half voice against both talkers' second-half voices."""
    path = data_file("en_2spk_phonecall_pyannote_sample/sample.wav")
    wave = decode_audio(path).mono
    turns = _rttm(path.with_suffix(".rttm"))
    half = wave.size / SAMPLE_RATE / 2
    first = {k: [(s, min(e, half)) for s, e in v if s < half] for k, v in turns.items()}
    second = {k: [(max(s, half), e) for s, e in v if e > half] for k, v in turns.items()}
    a = {v.speaker: np.asarray(v.vector) for v in speaker_embeddings(wave, first)}
    b = {v.speaker: np.asarray(v.vector) for v in speaker_embeddings(wave, second)}
    assert set(a) == set(b) == set(turns)
    for k in turns:
        assert np.linalg.norm(a[k]) == pytest.approx(1.0, abs=1e-5)
        other = next(j for j in turns if j != k)
        assert a[k] @ b[k] > a[k] @ b[other] + 0.2


def test_a_sample_without_speech_has_no_voice():
    assert sample_embedding(np.zeros(SAMPLE_RATE * 3, np.float32)) is None
    v = sample_embedding(decode_audio(data_file("en_jfk_inaugural/jfk.flac")).mono)
    assert v is not None and v.model.startswith("campplus@") and 5.0 < v.speech_s <= 11.0 and len(v.vector) == 192
