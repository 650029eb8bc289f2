"""Clustering of window embeddings into speakers, with an automatic speaker count and optional hints.

Method: agglomerative clustering (average linkage) on cosine distance between unit-length embeddings
(the usual AHC back end of x-vector diarization, e.g. Sell et al. 2018, DIHARD). The dendrogram is cut
at a distance threshold, a property of the embedding model (how far apart two windows of one speaker
usually are) rather than of a recording; clusters holding less than ``min_cluster_s`` seconds of
windows are then folded into the nearest larger cluster (such clusters are mostly overlap, laughter or
noise windows, not new speakers). Hints: ``num_speakers`` cuts the dendrogram at exactly that many
clusters; ``min_speakers`` / ``max_speakers`` clip the automatic count and re-cut.
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist


def _relabel(labels: np.ndarray) -> np.ndarray:
    """Renumber labels 0..k-1 in order of first appearance."""
    order: dict[int, int] = {}
    return np.array([order.setdefault(int(x), len(order)) for x in labels], dtype=np.int64)


def _fold_small(emb: np.ndarray, labels: np.ndarray, weight: np.ndarray, min_mass: float, keep: int) -> np.ndarray:
    """Merge clusters whose total ``weight`` is below ``min_mass`` into the closest cluster by centroid
    cosine, smallest first, while more than ``keep`` clusters remain."""
    labels = labels.copy()
    while True:
        ids = np.unique(labels)
        if len(ids) <= keep:
            return labels
        mass = np.array([weight[labels == i].sum() for i in ids])
        small = int(np.argmin(mass))
        if mass[small] >= min_mass:
            return labels
        cent = np.stack([emb[labels == i].mean(0) for i in ids])
        cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
        sim = cent @ cent[small]
        sim[small] = -np.inf
        labels[labels == ids[small]] = ids[int(np.argmax(sim))]


def cluster_embeddings(emb: np.ndarray, threshold: float, num_speakers: int | None = None,
                       min_speakers: int | None = None, max_speakers: int | None = None,
                       weight: np.ndarray | None = None, min_cluster_s: float = 2.0) -> np.ndarray:
    """Speaker index per embedding.

    Args:
        emb: float ``[n, d]``, unit-length rows.
        threshold: cosine distance (1 - cosine similarity) at which the average-linkage dendrogram is cut.
        num_speakers: exact count wanted (overrides the others). min_speakers / max_speakers: bounds on
            the automatic count. Counts are capped at ``n``.
        weight: seconds of speech each row stands for (default 1 each), for ``min_cluster_s``.
        min_cluster_s: clusters with less speech than this are folded into their nearest neighbour
            (never below ``min_speakers`` or ``num_speakers`` clusters).
    Returns:
        int64 ``[n]`` labels ``0..k-1``, numbered by first appearance.
    Raises:
        ValueError: inconsistent hints (``min_speakers > max_speakers``, counts below 1).
    """
    for name, v in (("num_speakers", num_speakers), ("min_speakers", min_speakers), ("max_speakers", max_speakers)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if min_speakers is not None and max_speakers is not None and min_speakers > max_speakers:
        raise ValueError(f"min_speakers ({min_speakers}) > max_speakers ({max_speakers})")
    n = emb.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    if n == 1:
        return np.zeros(1, np.int64)
    weight = np.ones(n) if weight is None else np.asarray(weight, float)
    tree = linkage(pdist(emb, metric="cosine").clip(min=0.0), method="average")
    if num_speakers is not None:
        k = min(num_speakers, n)
        return _relabel(fcluster(tree, t=k, criterion="maxclust") - 1)
    lo = min(min_speakers or 1, n)
    hi = min(max_speakers or n, n)
    labels = fcluster(tree, t=threshold, criterion="distance") - 1
    labels = _fold_small(emb, labels, weight, min_cluster_s, keep=lo)
    k = len(np.unique(labels))
    if k < lo or k > hi:
        labels = fcluster(tree, t=min(max(k, lo), hi), criterion="maxclust") - 1
    return _relabel(labels)
