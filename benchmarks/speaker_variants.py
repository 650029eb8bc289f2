"""Alternative decision rules of the speaker cascade, measured by ``eval_speakers.py --variant`` on the
simulated development set before any of them enters ``transcription/diarization/`` (the ones that win move
there; the rest stay here with the result file that rejected them).

``eigengap_cluster``: the speaker count from the eigengap of the normalised Laplacian of a pruned cosine
affinity (spectral clustering for diarization: Park et al., "Auto-tuning spectral clustering for speaker
diarization using normalized maximum eigengap", IEEE SPL 2019; here with a fixed pruning share, not the
auto-tuned one), the members from the average-linkage dendrogram cut at that count. Same signature and
hints as ``cluster.cluster_embeddings``.
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from transcription.diarization import cluster

PRUNE = 0.3
"""Share of each row's affinities kept (the largest), the rest set to 0, before symmetrising."""
MAX_K = 10


def eigengap_count(emb: np.ndarray, prune: float = PRUNE, max_k: int = MAX_K) -> int:
    """Speakers among unit rows ``emb [n, d]`` by the largest eigengap of the normalised Laplacian."""
    n = emb.shape[0]
    if n <= 2:
        return 1 if n < 2 or float(emb[0] @ emb[1]) > 0.4 else 2
    a = np.clip(emb @ emb.T, 0, 1)
    keep = max(2, int(np.ceil(prune * n)))
    thr = -np.sort(-a, axis=1)[:, keep - 1: keep]
    a = np.where(a >= thr, a, 0.0)
    a = (a + a.T) / 2
    d = a.sum(1)
    lap = np.eye(n) - a / np.sqrt(np.outer(d, d) + 1e-12)
    ev = np.sort(np.linalg.eigvalsh(lap))[: min(max_k, n - 1) + 1]
    return int(np.argmax(np.diff(ev))) + 1


def eigengap_cluster(emb, threshold, num_speakers=None, min_speakers=None, max_speakers=None, weight=None,
                     min_cluster_s=2.0, mass=None):
    if num_speakers is not None or emb.shape[0] < 2:
        return cluster.cluster_embeddings(emb, threshold, num_speakers, min_speakers, max_speakers, weight,
                                          min_cluster_s, mass)
    n = emb.shape[0]
    k = eigengap_count(emb)
    k = min(max(k, min_speakers or 1), max_speakers or n, n)
    tree = linkage(pdist(emb, metric="cosine").clip(min=0.0), method="average")
    labels = fcluster(tree, t=k, criterion="maxclust") - 1
    weight = np.ones(n) if weight is None else np.asarray(weight, float)
    labels = cluster._fold_small(emb, labels, mass or (lambda rows: float(weight[rows].sum())), min_cluster_s,
                                 keep=min(min_speakers or 1, n))
    return cluster._relabel(labels)
