"""Speakers the segmentation model hears only over someone else: new global speakers, deliberately.

``segmentation-3.0`` says, frame by frame, which of up to 3 local speakers talk (at most 2 at once). Two
local speakers active in the same frames of one chunk are two people by the model's account. The
clustering proposes global speakers only from embeddings with enough *solo* speech, so a talker who is
only ever heard over another (a backchannel, a second voice mixed over the first) proposes none; with
fewer centroids than local speakers in that chunk, the Hungarian mapping leaves the overlapping one
unassigned, and its speech would go to a speaker already talking there, i.e. be lost as overlap.

Here such unassigned local speakers, when they overlap another local speaker of their chunk for at least
``pipeline.MIN_ACTIVE_S``, become global speakers of their own: their embeddings (taken over all their
frames, hence blended with the other voice) are clustered among themselves with the same cut, and each
cluster is one more speaker, within ``max_speakers`` / ``num_speakers`` when given. Nothing here
lowers a threshold: the evidence is the model's own overlap output (the powerset classes with two
speakers), which the hard decoding already turned into two local speakers.
"""

from __future__ import annotations

import numpy as np

from transcription.diarization.cluster import cluster_embeddings


def overlapping_unassigned(act: np.ndarray, items: list[tuple[int, int]], assigned: np.ndarray,
                           min_frames: int) -> np.ndarray:
    """Indices of items ``(chunk, local speaker)`` left unassigned (``assigned == -1``) that talk at the
    same time as another local speaker of their chunk for at least ``min_frames`` frames.

    Args:
        act: ``[C, F, K]`` hard local activity (0/1). items: the embedded local speakers.
        assigned: int ``[n]`` centroid per item, ``-1`` for none. min_frames: frames of overlap needed.
    """
    out = []
    for i, ((c, k), g) in enumerate(zip(items, assigned, strict=True)):
        if g >= 0:
            continue
        mine = act[c, :, k] > 0
        others = np.delete(act[c], k, axis=1).sum(-1) > 0
        if (mine & others).sum() >= min_frames:
            out.append(i)
    return np.asarray(out, np.int64)


def add_overlap_speakers(emb: np.ndarray, cent: np.ndarray, assigned: np.ndarray, rows: np.ndarray,
                         threshold: float, room: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Centroids and assignment with one new global speaker per cluster of the ``rows`` embeddings.

    Args:
        emb: unit ``[n, d]`` embeddings of all items; cent: unit ``[g, d]`` centroids; assigned: ``[n]``.
        rows: items to turn into speakers (:func:`overlapping_unassigned`).
        threshold: the clustering cut (cosine distance) that groups ``rows`` into speakers.
        room: how many speakers may still be added (``None``: no limit); the rows' clustering is cut at
            that many clusters when it would give more.
    Returns:
        ``(centroids [g + m, d], assigned [n])``; unchanged when ``rows`` is empty or ``room`` is 0.
    """
    if rows.size == 0 or room == 0:
        return cent, assigned
    labels = cluster_embeddings(emb[rows], threshold, max_speakers=room, min_cluster_s=0.0)
    new = np.stack([emb[rows][labels == j].mean(0) for j in range(labels.max() + 1)])
    new /= np.maximum(np.linalg.norm(new, axis=1, keepdims=True), 1e-12)
    assigned = assigned.copy()
    assigned[rows] = len(cent) + labels
    return np.concatenate([cent, new]), assigned
