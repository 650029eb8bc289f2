"""The host side of ``diarize`` written as array operations gives what the per-item loops it replaced gave
(the loops are kept here as the reference), on random activity at realistic shapes."""

from __future__ import annotations

import numpy as np
import pytest

from transcription.audio.activity import aggregate
from transcription.diarization import pipeline as P


def _reconstruct_loop(offsets, act, items, assigned, num, n_spk, in_speech, nearest=None):
    clustered = np.zeros(act.shape[:2] + (n_spk,), np.float32)
    spare = np.zeros_like(clustered)
    for i, ((c, k), g) in enumerate(zip(items, assigned, strict=True)):
        if g >= 0:
            clustered[c, :, g] = np.maximum(clustered[c, :, g], act[c, :, k])
        elif nearest is not None:
            spare[c, :, nearest[i]] = np.maximum(spare[c, :, nearest[i]], act[c, :, k])
    score, _ = aggregate(offsets, clustered, num)
    spare_score, _ = aggregate(offsets, spare, num)
    count, _ = aggregate(offsets, act.sum(-1), num)
    extra = (count >= 1) & (count - np.floor(count) >= P.COUNT_ROUND)  # the pipeline's count rule
    count = np.where(extra, np.floor(count) + 1, np.rint(count)).astype(int) * in_speech
    active = np.zeros((num, n_spk), bool)
    order = np.argsort(-score, axis=1, kind="stable")
    for j in np.flatnonzero(count):
        top = order[j, : count[j]]
        top = top[score[j, top] > 0]
        if top.size == 0 and spare_score[j].max() > 0:
            top = np.argsort(-spare_score[j], kind="stable")[: count[j]]
            top = top[spare_score[j, top] > 0]
        active[j, top] = True
    return active


def _activity(rng, chunks, frames=589):
    act = (rng.random((chunks, frames, 3)) < 0.35).astype(np.float32)
    act[rng.random((chunks, frames)) < 0.3] = 0.0  # silence
    return act


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reconstruct_equals_the_per_item_loop(seed):
    rng = np.random.default_rng(seed)
    chunks = 12
    offsets = np.arange(chunks) * 148 - 59
    num = int(offsets[-1] + 589 - 59)
    act = _activity(rng, chunks)
    items = [(c, k) for c in range(chunks) for k in range(3) if rng.random() < 0.7]
    n_spk = 4
    assigned = rng.integers(-1, n_spk, len(items))
    nearest = rng.integers(0, n_spk, len(items))
    in_speech = rng.random(num) < 0.8
    for near in (nearest, None):
        want = _reconstruct_loop(offsets, act, items, assigned, num, n_spk, in_speech, near)
        got = P._reconstruct(offsets, act, items, assigned, num, n_spk, in_speech, near)
        assert got.dtype == bool and np.array_equal(got, want)
    assert not P._reconstruct(offsets, act, [], np.zeros(0, int), num, 1, in_speech).any()


def test_local_speakers_and_their_solo_frames_equal_the_loop():
    rng = np.random.default_rng(3)
    chunks = 9
    offsets = np.arange(chunks) * 148 - 59
    act = _activity(rng, chunks)
    act[2, :, 1] = 0.0  # a local speaker that never talks
    act[4, :5, 2], act[4, 5:, 2] = 1.0, 0.0  # one that talks too briefly
    wave = np.zeros(int((offsets[-1] * P.DT + 10.0) * 16000), np.float32)

    class Recorder:
        name = "campplus"

        def embed(self, wave, windows, masks, should_cancel=None):
            self.windows, self.masks = windows, masks
            return np.zeros((len(windows), 4), np.float32)

    emb = Recorder()
    items, clean_s, solo, _ = P._embed_local_speakers(wave, offsets, act, emb)
    # the loop it replaced
    duration = wave.size / 16000
    solo_mask = act.sum(-1, keepdims=True) == 1
    want_items, want_clean, want_frames, want_windows, want_masks = [], [], [], [], []
    for c, o in enumerate(offsets):
        start = o * P.DT
        window = (max(0.0, start), min(duration, start + P.CHUNK_S))
        for k in range(3):
            active = act[c, :, k] > 0
            if active.sum() * P.DT < P.MIN_ACTIVE_S:
                continue
            clean = active & solo_mask[c, :, 0]
            use = clean if clean.sum() * P.DT >= P.MIN_CLEAN_S else active
            want_items.append((c, k))
            want_clean.append(clean.sum() * P.DT)
            want_frames.append(set((o + np.flatnonzero(clean)).tolist()))
            want_windows.append(window)
            n = round((window[1] - window[0]) * 100)
            t = window[0] + np.arange(n) * 0.01 + 0.0125
            f = np.clip(np.round((t - start) * 16000 / 270 - 495 / 270).astype(int), 0, len(use) - 1)
            want_masks.append(use[f])
    assert items == want_items and (2, 1) not in items and (4, 2) not in items
    assert np.array_equal(clean_s, np.array(want_clean))
    assert emb.windows == want_windows
    assert all(np.array_equal(a, b) for a, b in zip(emb.masks, want_masks, strict=True))
    for rows in (np.arange(len(items)), np.array([0, 3, 5]), np.array([], int)):
        assert solo.count(rows) == len(set().union(*(want_frames[i] for i in rows)))
