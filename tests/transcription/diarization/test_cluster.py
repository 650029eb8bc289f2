"""Clustering of unit embeddings: automatic count, hints, folding of tiny clusters."""

from __future__ import annotations

import numpy as np
import pytest

from transcription.diarization.cluster import assign_to_centroids, cluster_embeddings


def _blobs(sizes, dim=16, spread=0.15, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.linalg.qr(rng.normal(size=(dim, dim)))[0][: len(sizes)]  # orthogonal speaker directions
    x = np.concatenate([c + spread * rng.normal(size=(n, dim)) for c, n in zip(centres, sizes, strict=True)])
    truth = np.repeat(np.arange(len(sizes)), sizes)
    return x / np.linalg.norm(x, axis=1, keepdims=True), truth


def _same_partition(a, b):
    return all(len(set(b[a == k])) == 1 for k in set(a)) and len(set(a)) == len(set(b))


def test_automatic_count_finds_separated_speakers():
    x, truth = _blobs([20, 12, 30])
    labels = cluster_embeddings(x, threshold=0.6)
    assert _same_partition(labels, truth)
    assert labels[0] == 0 and labels[20] == 1  # numbered by first appearance


def test_one_speaker_stays_one():
    x, _ = _blobs([40])
    assert set(cluster_embeddings(x, threshold=0.6)) == {0}


def test_hints_are_honoured():
    x, truth = _blobs([20, 12, 30])
    assert len(set(cluster_embeddings(x, 0.6, num_speakers=2))) == 2
    assert len(set(cluster_embeddings(x, 0.6, num_speakers=5))) == 5
    assert len(set(cluster_embeddings(x, 0.6, max_speakers=2))) == 2
    assert len(set(cluster_embeddings(x, 0.6, min_speakers=4))) == 4
    assert _same_partition(cluster_embeddings(x, 0.6, min_speakers=2, max_speakers=3), truth)
    with pytest.raises(ValueError):
        cluster_embeddings(x, 0.6, min_speakers=3, max_speakers=2)
    with pytest.raises(ValueError):
        cluster_embeddings(x, 0.6, num_speakers=0)


def test_tiny_cluster_is_folded_unless_a_hint_needs_it():
    x, truth = _blobs([30, 2])  # a two-window "speaker": 0.75 s of speech at 0.375 s per window
    w = np.full(len(x), 0.375)
    assert set(cluster_embeddings(x, 0.6, weight=w, min_cluster_s=2.0)) == {0}
    assert _same_partition(cluster_embeddings(x, 0.6, weight=w, min_cluster_s=2.0, min_speakers=2), truth)


def test_degenerate_sizes():
    assert cluster_embeddings(np.zeros((0, 8)), 0.6).shape == (0,)
    assert cluster_embeddings(np.ones((1, 8)) / np.sqrt(8), 0.6, num_speakers=3).tolist() == [0]


def test_assignment_keeps_local_speakers_of_one_chunk_apart():
    cent = np.eye(3)[:2]  # two speakers
    emb = np.array([[0.9, 0.1, 0.0], [0.8, 0.2, 0.0], [0.7, 0.0, 0.1]])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    # rows 0 and 1 are one chunk: both look like speaker 0, but they are two people
    assert assign_to_centroids(emb, cent, [0, 0, 1]).tolist() == [0, 1, 0]
    # three local speakers, two centroids: the least similar one is left out
    assert assign_to_centroids(emb, cent, [0, 0, 0]).tolist() == [0, 1, -1]


def test_mass_callable_decides_folding():
    x, truth = _blobs([30, 5])
    # rows overlap in time, so the small cluster's mass is what the callable says, not a sum of weights
    assert set(cluster_embeddings(x, 0.6, mass=lambda rows: 1.0 if rows[-1] else 10.0)) == {0}
    assert _same_partition(cluster_embeddings(x, 0.6, mass=lambda rows: 3.0), truth)


def test_window_clustering_is_bounded_and_keeps_the_speakers(monkeypatch):
    from transcription.diarization import windows

    x, truth = _blobs([300, 200, 500])
    monkeypatch.setattr(windows, "MAX_CLUSTERED", 100)  # 1000 windows: 100 clustered, 900 by nearest centroid
    labels = windows._cluster_bounded(x, np.full(len(x), 0.375), 0.6, None, None, None)
    assert _same_partition(labels, truth)
    assert len(set(windows._cluster_bounded(x, np.full(len(x), 0.375), 0.6, 2, None, None))) == 2
