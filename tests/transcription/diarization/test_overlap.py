"""Overlap-only local speakers become speakers; the speaker count a chunk implies; the count the turns
must hold under the hints (pure functions, synthetic inputs)."""

from __future__ import annotations

import numpy as np

from transcription.diarization.overlap import add_overlap_speakers, overlapping_unassigned
from transcription.diarization.pipeline import implied_speakers, lower_bound


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_only_unassigned_local_speakers_that_talk_over_another_are_picked():
    act = np.zeros((2, 100, 3), np.float32)
    act[0, :60, 0] = 1  # chunk 0: speaker 0 throughout, speaker 1 over it for 20 frames, speaker 2 alone later
    act[0, 40:60, 1] = 1
    act[0, 70:90, 2] = 1
    act[1, :50, 0] = 1  # chunk 1: speaker 1 over speaker 0 for 5 frames only
    act[1, 45:80, 1] = 1
    items = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assigned = np.array([0, -1, -1, 0, -1])
    assert overlapping_unassigned(act, items, assigned, min_frames=12).tolist() == [1]
    assert overlapping_unassigned(act, items, assigned, min_frames=5).tolist() == [1, 4]
    assigned[1] = 1  # an assigned one is left alone
    assert overlapping_unassigned(act, items, assigned, min_frames=5).tolist() == [4]


def test_overlap_speakers_are_clustered_among_themselves_and_capped():
    cent = _unit([[1, 0, 0, 0]])
    emb = _unit([[1, 0.1, 0, 0], [0, 1, 0.05, 0], [0, 1, -0.05, 0], [0, 0, 0, 1]])
    assigned = np.array([0, -1, -1, -1])
    rows = np.array([1, 2, 3])
    new_cent, new_assigned = add_overlap_speakers(emb, cent, assigned, rows, threshold=0.6, room=None)
    assert new_cent.shape == (3, 4) and np.allclose(np.linalg.norm(new_cent, axis=1), 1)
    assert new_assigned[0] == 0 and new_assigned[1] == new_assigned[2] != new_assigned[3]
    assert set(new_assigned[1:]) == {1, 2}
    capped_cent, capped = add_overlap_speakers(emb, cent, assigned, rows, threshold=0.6, room=1)
    assert capped_cent.shape == (2, 4) and set(capped[1:]) == {1}
    same_cent, same = add_overlap_speakers(emb, cent, assigned, rows, threshold=0.6, room=0)
    assert same_cent is cent and (same == assigned).all()


def test_a_chunk_with_two_long_solo_local_speakers_implies_two_speakers():
    items = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert implied_speakers(items, np.array([3.0, 1.5, 4.0, 0.4, 0.9])) == 2
    assert implied_speakers(items, np.array([3.0, 0.5, 4.0, 0.4, 0.9])) == 1
    assert implied_speakers([], np.zeros(0)) == 0


def test_lower_bound_follows_the_hints():
    assert lower_bound(2, None, None, None) == 2
    assert lower_bound(0, None, None, None) == 1
    assert lower_bound(2, 1, None, None) == 1  # an exact count wins over what the chunks imply
    assert lower_bound(1, None, 3, None) == 3
    assert lower_bound(3, None, None, 2) == 2
    assert lower_bound(2, None, 1, 4) == 2
