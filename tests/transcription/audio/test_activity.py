"""Chunk outputs onto one frame grid, and speech-region clean-up."""

from __future__ import annotations

import numpy as np

from transcription.audio.activity import aggregate, clean_up, frame_edges, grid_size, runs
from transcription.audio.segmentation import FRAME_SIZE, FRAME_STEP


def test_aggregate_means_over_the_chunks_that_see_a_frame():
    offsets = np.array([-2, 1])  # the first chunk starts in the padding before the recording
    values = np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    mean, count = aggregate(offsets, values, num=6)
    # global frames 0..2 come from chunk 0 (its frames 2..4), 1..5 from chunk 1
    assert count.tolist() == [1, 2, 2, 1, 1, 1]
    assert mean.tolist() == [1.0, 0.5, 0.5, 0.0, 0.0, 0.0]


def test_aggregate_keeps_trailing_dimensions():
    values = np.ones((2, 4, 3))
    values[1, :, 2] = 0.0
    mean, _ = aggregate(np.array([0, 2]), values, num=5)
    assert mean.shape == (5, 3) and mean[2].tolist() == [1.0, 1.0, 0.5] and mean[0].tolist() == [1, 1, 1]


def test_grid_and_edges():
    n = 30 * 16000
    num = grid_size(n, np.array([0, 1200]), 589)  # chunks reach past 30 s
    centres_last = ((num - 1) * FRAME_STEP + FRAME_SIZE // 2) / 16000
    assert centres_last < 30.0 <= centres_last + FRAME_STEP / 16000
    edges = frame_edges(num)
    assert edges[0] == 0.0 and np.all(np.diff(edges) > 0) and len(edges) == num + 1


def test_runs_and_clean_up():
    edges = np.arange(11) * 0.1
    assert runs(np.array([0, 1, 1, 0, 0, 1, 0, 0, 1, 1], bool), edges) == [
        (0.1, 0.30000000000000004), (0.5, 0.6000000000000001), (0.8, 1.0)]
    regions = [(1.0, 2.0), (2.2, 3.0), (5.0, 5.1), (6.0, 7.0), (7.15, 8.0)]
    out = clean_up(regions, min_speech_s=0.25, min_silence_s=0.3, pad_s=0.1, duration=8.05)
    # 0.2 s and 0.15 s gaps are bridged, the 0.1 s burst is dropped, pads stop at the recording end
    assert out == [(0.9, 3.1), (5.9, 8.05)]
