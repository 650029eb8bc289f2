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

from collections.abc import Callable

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import pdist

from diarist.contract.options import check_hints


def _relabel(labels: np.ndarray) -> np.ndarray:
    """Renumber labels 0..k-1 in order of first appearance."""
    order: dict[int, int] = {}
    return np.array([order.setdefault(int(x), len(order)) for x in labels], dtype=np.int64)


def _fold_small(emb: np.ndarray, labels: np.ndarray, mass_of: Callable[[np.ndarray], float], min_mass: float,
                keep: int) -> np.ndarray:
    """Merge clusters whose mass (``mass_of(member_mask)``) is below ``min_mass`` into the closest cluster
    by centroid cosine, smallest first, while more than ``keep`` clusters remain."""
    labels = labels.copy()
    while True:
        ids = np.unique(labels)
        if len(ids) <= keep:
            return labels
        mass = np.array([mass_of(labels == i) for i in ids])
        small = int(np.argmin(mass))
        if mass[small] >= min_mass:
            return labels
        cent = np.stack([emb[labels == i].mean(0) for i in ids])
        cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
        sim = cent @ cent[small]
        sim[small] = -np.inf
        labels[labels == ids[small]] = ids[int(np.argmax(sim))]


def assign_to_centroids(emb: np.ndarray, centroids: np.ndarray, groups: list[int]) -> np.ndarray:
    """Map each embedding to a centroid, where embeddings of one group (the local speakers of one
    segmentation chunk, who are different people) must take different centroids.

    Args:
        emb: float ``[n, d]`` unit rows; centroids: float ``[k, d]`` unit rows; groups: ``n`` group ids.
    Returns:
        int64 ``[n]`` centroid index per row, maximising the summed cosine similarity within each group
        (Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``); ``-1`` for rows left over when a
        group has more rows than there are centroids.
    """
    out = np.full(len(emb), -1, np.int64)
    sim = emb @ centroids.T
    g = np.asarray(groups)
    for key in np.unique(g):
        rows = np.flatnonzero(g == key)
        r, c = linear_sum_assignment(sim[rows], maximize=True)
        out[rows[r]] = c
    return out


def cluster_embeddings(emb: np.ndarray, threshold: float, num_speakers: int | None = None,
                       min_speakers: int | None = None, max_speakers: int | None = None,
                       weight: np.ndarray | None = None, min_cluster_s: float = 2.0,
                       mass: Callable[[np.ndarray], float] | None = None) -> np.ndarray:
    """Speaker index per embedding.

    Args:
        emb: float ``[n, d]``, unit-length rows.
        threshold: cosine distance (1 - cosine similarity) at which the average-linkage dendrogram is cut.
        num_speakers: exact count wanted (overrides the others). min_speakers / max_speakers: bounds on
            the automatic count. Counts are capped at ``n``.
        weight: seconds of speech each row stands for (default 1 each), for ``min_cluster_s``.
        mass: seconds of speech of a set of rows (bool mask ``[n]`` -> float), for ``min_cluster_s`` when
            rows overlap in time so that weights do not add up (default: the sum of ``weight``).
        min_cluster_s: clusters with less speech than this are folded into their nearest neighbour
            (never below ``min_speakers`` or ``num_speakers`` clusters).
    Returns:
        int64 ``[n]`` labels ``0..k-1``, numbered by first appearance.
    Raises:
        ValueError: inconsistent hints (``min_speakers > max_speakers``, counts below 1).
    """
    check_hints(num_speakers, min_speakers, max_speakers)
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
    labels = _fold_small(emb, labels, mass or (lambda rows: float(weight[rows].sum())), min_cluster_s, keep=lo)
    k = len(np.unique(labels))
    if k < lo or k > hi:
        labels = fcluster(tree, t=min(max(k, lo), hi), criterion="maxclust") - 1
    return _relabel(labels)
