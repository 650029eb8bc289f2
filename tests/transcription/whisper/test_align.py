"""Word timestamps from cross-attention DTW: plausible and monotonic on jfk.flac, and equal (within 0.1 s) to
faster-whisper's ``word_timestamps=True`` on the same CTranslate2 tiny.en files."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
import torch

from tests.conftest import decode_and_align
from transcription.whisper.align import MIN_WORD_S, _median_filter, align_words, dtw_path, keep_min_duration
from transcription.whisper.decoding import split_segments


@pytest.fixture(scope="module")
def jfk(whisper_engine):
    wave, seq, words, tt, _ = decode_and_align(whisper_engine, "en_jfk_inaugural/jfk.flac", 200)
    return wave, seq, words, tt


def _norm(w: str) -> str:
    return re.sub(r"[^a-z']", "", w.lower())


def test_words_cover_the_text_in_order(whisper_engine, jfk):
    wave, seq, words, tt = jfk
    text = whisper_engine.tokenizer.decode([t for t in seq.output_ids if t < tt.eot])
    assert "".join(w["word"] for w in words) == text
    assert [_norm(w["word"]) for w in words][:5] == ["and", "so", "my", "fellow", "americans"]
    dur = len(wave) / 16000
    prev = 0.0
    for w in words:
        assert prev <= w["start"] <= w["end"] <= dur
        prev = w["end"]
    assert words[0]["start"] < 1.0 and words[-1]["end"] > 9.5


def test_words_know_their_segment(jfk):
    wave, seq, words, tt = jfk
    segs = split_segments(tt, seq.output_ids, math.ceil(len(wave) / 160) / 100)
    for i, seg in enumerate(segs):
        assert [t for w in words if w["segment"] == i for t in w["tokens"]] == seg.token_ids
        inside = [w for w in words if w["segment"] == i]
        assert inside[0]["start"] >= seg.start - 1e-6 - 0.5 and inside[-1]["end"] <= seg.end + 1e-6


def test_matches_faster_whisper_word_timestamps(jfk):
    """Same method (alignment heads, median filter 7, DTW) on the same weights, both in float32: word
    boundaries agree to one or two 20 ms frames; the rest comes from the two post-processing
    heuristics (pause-edge clipping, trailing punctuation). Tolerance: 90% of boundaries within 0.1 s
    (5 frames), mean difference under 0.05 s."""
    fw = pytest.importorskip("faster_whisper")
    from engine.loaders import bundled_whisper_dir

    wave, _, words, _ = jfk
    model = fw.WhisperModel(str(bundled_whisper_dir()), device="cpu", compute_type="float32", cpu_threads=1)
    segs, _ = model.transcribe(wave, beam_size=1, temperature=0.0, word_timestamps=True,
                               condition_on_previous_text=False, vad_filter=False)
    ref = [w for s in segs for w in s.words]
    assert [_norm(w["word"]) for w in words] == [_norm(w.word) for w in ref]
    diffs = np.array([[abs(a["start"] - b.start), abs(a["end"] - b.end)] for a, b in zip(words, ref, strict=True)])
    assert (diffs <= 0.1).mean() >= 0.9, diffs
    assert diffs.mean() < 0.05, diffs


def test_dtw_finds_the_cheap_monotonic_path():
    rng = np.random.default_rng(0)
    n, m = 6, 40
    cost = rng.uniform(1, 2, (n, m))
    cols = [0, 5, 12, 20, 31, 39]
    for i in range(n):  # a cheap step path: row i owns columns cols[i]..cols[i+1]-1
        hi = cols[i + 1] if i + 1 < n else m
        cost[i, cols[i] : hi] = 0.0
    rows, c = dtw_path(cost)
    assert rows[0] == 0 and c[0] == 0 and rows[-1] == n - 1 and c[-1] == m - 1
    assert np.all(np.diff(rows) >= 0) and np.all(np.diff(c) >= 0) and np.all(np.diff(rows) + np.diff(c) >= 1)
    entered = c[np.flatnonzero(np.diff(rows, prepend=-1))]
    assert entered.tolist() == cols
    assert cost[rows, c].sum() == 0.0


def test_median_filter_matches_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    x = torch.randn(3, 5, 50)
    ours = _median_filter(x, 7).numpy()
    ref = ndimage.median_filter(x.numpy(), size=(1, 1, 7), mode="mirror")  # torch 'reflect' == scipy 'mirror'
    np.testing.assert_allclose(ours, ref)


def test_no_text_and_no_heads(whisper_engine, jfk):
    eng = whisper_engine
    _, seq, _, tt = jfk
    enc = seq.mm_state["encoder"]
    assert align_words(eng.model, eng.tokenizer, enc, [tt.sot], [tt.timestamp_begin, tt.eot], [[3, 0]], 1000) == []
    with pytest.raises(ValueError):
        align_words(eng.model, eng.tokenizer, enc, [tt.sot], seq.output_ids, [], 1000)


def test_no_word_is_zero_length_on_a_conversation(whisper_engine):
    """DTW enters several token rows at one frame on conversational speech (tiny.en on the phone call gave
    words with ``end == start``); every word now lasts at least one frame and none overlaps the next."""
    _, _, words, _, frames = decode_and_align(whisper_engine, "en_2spk_phonecall_pyannote_sample/sample.wav", 224)
    assert len(words) > 40
    for a, b in itertools.pairwise(words):
        assert a["end"] <= b["start"] + 1e-9
    assert all(w["end"] - w["start"] >= MIN_WORD_S - 1e-6 for w in words)
    assert 0 <= words[0]["start"] and words[-1]["end"] <= frames / 100


def _spans(words):
    return [(round(w["start"], 6), round(w["end"], 6)) for w in words]


def test_min_duration_pushes_only_as_far_as_needed_and_stays_inside():
    ws = [{"start": 0.0, "end": 0.5}, {"start": 0.5, "end": 0.5}, {"start": 0.5, "end": 0.5},
          {"start": 0.5, "end": 1.0}, {"start": 1.98, "end": 2.0}, {"start": 2.0, "end": 2.0}]
    keep_min_duration(ws, 0.02, 0.0, 2.0)
    # the two empty words take the next 40 ms from the long word after them; the last two fit before 2.0 s
    assert _spans(ws) == [(0.0, 0.5), (0.5, 0.52), (0.52, 0.54), (0.54, 1.0), (1.96, 1.98), (1.98, 2.0)]


def test_min_duration_shares_a_window_too_short_for_all_words():
    ws = [{"start": 0.0, "end": 0.0} for _ in range(4)]
    keep_min_duration(ws, 0.02, 1.0, 1.04)
    assert _spans(ws) == [(1.0, 1.01), (1.01, 1.02), (1.02, 1.03), (1.03, 1.04)]
