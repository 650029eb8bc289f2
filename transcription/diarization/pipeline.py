"""Who speaks when: local speaker segmentation ▸ per-chunk speaker embeddings ▸ global clustering ▸
overlap-aware reconstruction (the structure of pyannote's speaker-diarization-3.x pipeline, written
here from its description; models: ``segmentation-3.0`` and CAM++).

1. ``segmentation-3.0`` runs on 10 s chunks every ``segmentation.STEP_S`` seconds; in each chunk it
   says which of up to 3 *local* speakers talk in each 17 ms frame (at most 2 at once).
2. Each local speaker of each chunk that talks long enough gets a CAM++ embedding of the frames where
   it talks alone (all its frames when those are too few).
3. Embeddings with at least ``TRAIN_CLEAN_S`` seconds of solo speech are clustered
   (``cluster.cluster_embeddings``: average-linkage AHC, cut at ``THRESHOLD``, clusters with less than
   ``MIN_CLUSTER_S`` of solo speech folded into their neighbour); then every
   local speaker is mapped to a global speaker, chunk by chunk, with the constraint that two local
   speakers of one chunk are two different people (``cluster.assign_to_centroids``).
   A local speaker left unassigned that the model hears *over* another one of its chunk is a speaker
   of its own (``overlap.py``): it never talks alone, so it proposed no cluster.
4. Each frame gets as many speakers as the chunks that see it say talk there (their mean count,
   rounded), taking the global speakers with the most support from the chunks; runs become turns.
5. Speaker count: a chunk with two local speakers that each talk alone for ``TRAIN_CLEAN_S`` implies
   two speakers (:func:`implied_speakers`), and ``num_speakers`` / ``min_speakers`` ask for a count. If
   the turns hold fewer speakers than that, the voices share local speakers, which no reconstruction
   can undo; the window pipeline (``windows.py``: 1.5 s CAM++ windows) is run at that count instead.

Overlap (the documented choice): turns are overlap-aware, so two speakers can hold one instant, as in
the reference annotations DER is scored against. A transcript still carries each word once:
``assign.assign_speakers`` gives a word to the speaker whose turns cover most of it.

``diarize(..., embedder=GE2EEmbedder())``, or a missing ``segmentation-3.0``, uses the older window
pipeline (``windows.py``), kept as the fallback and as the baseline of docs/diarization.md.
"""

from __future__ import annotations

import numpy as np

from transcription.audio import SAMPLE_RATE
from transcription.audio.activity import aggregate, frame_edges, grid_size
from transcription.audio.segmentation import (
    CHUNK_S,
    FRAME_STEP,
    frame_centres,
    segment_cached,
    to_multilabel,
)
from transcription.cancel import ShouldCancel, check
from transcription.diarization.cluster import assign_to_centroids, check_hints, cluster_embeddings
from transcription.diarization.embedders import default_embedder
from transcription.diarization.overlap import add_overlap_speakers, overlapping_unassigned
from transcription.diarization.turns import Turn, activity_to_turns, number_by_appearance

__all__ = ["Turn", "diarize"]

THRESHOLD = 0.6
"""Cosine-distance cut for CAM++ embeddings (docs/diarization.md: how it was chosen, sensitivity)."""
MIN_ACTIVE_S = 0.2
"""A local speaker talking less than this in a chunk is ignored (no embedding, no turns)."""
MIN_CLEAN_S = 0.5
"""Solo speech needed to embed only solo frames; below it all the speaker's frames are used."""
TRAIN_CLEAN_S = 1.0
"""Solo speech (seconds within one chunk) an embedding needs to propose a speaker, i.e. to take part in
the clustering itself (pyannote: 2 s; a CAM++ embedding of 1 s already tells voices apart, and brief
talkers in meetings rarely talk alone for 2 s)."""
MIN_CLUSTER_S = 2.0
"""A cluster whose members talk alone for less than this in total (seconds, each frame counted once)
joins its nearest cluster: one speaker needs 2 s of solo speech to count."""
MIN_REGION_S = 0.1
"""Speech regions shorter than this are ignored (too short to hold a word)."""
COUNT_ROUND = 0.5
"""A frame that has speech gets ``n + 1`` speakers (``n >= 1``) when the chunks that see it say
``n + COUNT_ROUND`` or more on average (0.5: rounding to the nearest); whether it has speech at all is
the mean count rounded."""

DT = FRAME_STEP / SAMPLE_RATE


def _region_frames(speech: list[tuple[float, float]], num: int) -> list[tuple[int, int]]:
    """``[a, b)`` global frame ranges whose centres fall in each speech region."""
    centres = frame_centres(np.arange(num))
    return [(int(np.searchsorted(centres, s)), int(np.searchsorted(centres, e))) for s, e in speech]


def _speech_mask(speech: list[tuple[float, float]], num: int) -> np.ndarray:
    mask = np.zeros(num, bool)
    for a, b in _region_frames(speech, num):
        mask[a:b] = True
    return mask


def _frame_masks(use: np.ndarray, windows: np.ndarray, chunk_starts: np.ndarray) -> list[np.ndarray]:
    """Segmentation frames of local speakers -> bool masks over the 10 ms fbank frames of their windows.

    Args:
        use: bool ``[n, F]`` frames of each local speaker; windows: float ``[n, 2]`` seconds;
        chunk_starts: float ``[n]`` start of each speaker's chunk (seconds, negative in the padding).
    Returns:
        ``n`` bool arrays of ``round(100 * (end - start))`` frames each.
    """
    sizes = np.array([round((e - s) * 100) for s, e in windows.tolist()], np.int64)
    out: list[np.ndarray] = [np.zeros(0, bool)] * len(use)
    for n in np.unique(sizes):  # windows of one length (all but the first and last chunks') at once
        rows = np.flatnonzero(sizes == n)
        t = windows[rows, :1] + np.arange(n) * 0.01 + 0.0125  # centre of each 25 ms fbank frame
        f = np.clip(np.round((t - chunk_starts[rows, None]) * SAMPLE_RATE / FRAME_STEP - 495 / FRAME_STEP)
                    .astype(int), 0, use.shape[1] - 1)
        masks = np.take_along_axis(use[rows], f, axis=1)
        for r, m in zip(rows.tolist(), masks, strict=True):
            out[r] = m
    return out


class SoloFrames:
    """The global frames where each embedded local speaker talks alone: item ``i``'s are
    ``offsets[i] + flatnonzero(clean[i])`` (``offsets`` int ``[n]``, ``clean`` bool ``[n, F]``)."""

    def __init__(self, offsets: np.ndarray, clean: np.ndarray) -> None:
        self.offsets, self.clean = offsets, clean

    def count(self, rows: np.ndarray) -> int:
        """Distinct global frames where any of the items ``rows`` talks alone (each frame counted once)."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return 0
        frames = (self.offsets[rows, None] + np.arange(self.clean.shape[1]))[self.clean[rows]]
        return int(np.unique(frames).size)


def _embed_local_speakers(wave, offsets, act, embedder, should_cancel: ShouldCancel = None):
    """Embeddings of the local speakers that talk long enough: ``(items [(c, k)], clean_s [n], solo frames
    (:class:`SoloFrames`), emb [n, d])``, items in chunk order, then local speaker order."""
    duration = wave.size / SAMPLE_RATE
    active = act > 0  # [C, F, K]
    clean = active & (act.sum(-1, keepdims=True) == 1)
    c, k = np.nonzero(active.sum(1) * DT >= MIN_ACTIVE_S)
    n_clean = clean.sum(1)[c, k]
    clean_s = n_clean * DT
    use = np.where((n_clean * DT >= MIN_CLEAN_S)[:, None], clean[c, :, k], active[c, :, k])
    start = offsets[c] * DT  # negative for the first chunk: it starts in the silence padding
    windows = np.stack([np.maximum(0.0, start), np.minimum(duration, start + CHUNK_S)], axis=1)
    items = list(zip(c.tolist(), k.tolist(), strict=True))
    solo_frames = SoloFrames(np.asarray(offsets)[c], clean[c, :, k])
    if not items:
        return items, np.zeros(0), solo_frames, np.zeros((0, 1), np.float32)
    masks = _frame_masks(use, windows, start)
    emb = embedder.embed(wave, [tuple(w) for w in windows.tolist()], masks, should_cancel=should_cancel)
    return items, clean_s, solo_frames, emb


def implied_speakers(items: list[tuple[int, int]], clean_s: np.ndarray) -> int:
    """The most local speakers with ``TRAIN_CLEAN_S`` of solo speech in any one chunk: segmentation-3.0
    says they are different people (the constraint the Hungarian mapping applies too), so the recording
    has at least that many speakers (0 when no chunk has one)."""
    per_chunk: dict[int, int] = {}
    for (c, _), s in zip(items, clean_s, strict=True):
        if s >= TRAIN_CLEAN_S:
            per_chunk[c] = per_chunk.get(c, 0) + 1
    return max(per_chunk.values(), default=0)


def lower_bound(implied: int, num_speakers: int | None, min_speakers: int | None, max_speakers: int | None) -> int:
    """Fewest speakers the turns must hold: ``num_speakers`` when given, else the larger of
    ``min_speakers`` and the ``implied`` count, never above ``max_speakers``."""
    if num_speakers is not None:
        return num_speakers
    lo = max(min_speakers or 1, implied)
    return lo if max_speakers is None else min(lo, max_speakers)


def _cluster(emb, clean_s, solo_frames, threshold, num_speakers, min_speakers, max_speakers):
    """Global speaker centroids ``[g, d]`` from the embeddings with enough solo speech.

    ``min_speakers`` here already includes the implied count (:func:`lower_bound`). A cluster's mass for
    ``MIN_CLUSTER_S`` is the time its members talk alone, counted once per global frame (each frame is
    seen by several chunks)."""
    train = np.flatnonzero(clean_s >= TRAIN_CLEAN_S)
    if len(train) < (num_speakers or min_speakers or 1):  # too few to give the count asked: use all there is
        train = np.arange(len(emb))

    def mass(rows: np.ndarray) -> float:
        return solo_frames.count(train[rows]) * DT

    labels = cluster_embeddings(emb[train], threshold, num_speakers, min_speakers, max_speakers,
                                min_cluster_s=MIN_CLUSTER_S, mass=mass)
    cent = np.stack([emb[train][labels == g].mean(0) for g in range(labels.max() + 1)])
    return cent / np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)


def _room(found: int, num_speakers: int | None, max_speakers: int | None) -> int | None:
    """How many overlap-only speakers may be added to ``found`` clusters under the hints (None: any)."""
    cap = num_speakers if num_speakers is not None else max_speakers
    return None if cap is None else max(0, cap - found)


def _reconstruct(offsets, act, items, assigned, num, n_spk, in_speech, nearest=None):
    """Per-frame global speakers ``[num, n_spk]`` bool from chunk activity and the local->global map.

    ``nearest`` (optional, per item): the closest centroid of each local speaker. A local speaker left
    unassigned (its chunk has more local speakers than there are clusters, e.g. ``num_speakers=1``) does
    not add to the scores; but a frame where only such speakers talk would otherwise lose its speech, so
    there the nearest centroid of the unassigned speakers takes it (pyannote keeps those frames too)."""
    clustered = np.zeros(act.shape[:2] + (n_spk,), np.float32)
    spare = np.zeros_like(clustered)
    if items:
        c, k = np.asarray(items, np.int64).T
        assigned = np.asarray(assigned, np.int64)
        own = assigned >= 0
        # max over the local speakers mapped to one (chunk, global speaker): np.maximum.at does it unbuffered
        np.maximum.at(clustered.transpose(0, 2, 1), (c[own], assigned[own]), act[c[own], :, k[own]])
        if nearest is not None:
            near = np.asarray(nearest, np.int64)[~own]
            np.maximum.at(spare.transpose(0, 2, 1), (c[~own], near), act[c[~own], :, k[~own]])
    score, _ = aggregate(offsets, clustered, num)
    spare_score, _ = aggregate(offsets, spare, num)
    count, _ = aggregate(offsets, act.sum(-1), num)
    extra = (count >= 1) & (count - np.floor(count) >= COUNT_ROUND)  # one more overlapping speaker
    count = np.where(extra, np.floor(count) + 1, np.rint(count)).astype(int) * in_speech
    # each frame takes its ``count`` best-scored speakers among those scored above 0 (stable order on ties);
    # a frame none of whose speakers scores takes the best of the unassigned speakers' nearest centroids
    active = _top(score, count)
    fallback = (count > 0) & ~(score > 0).any(1) & (spare_score.max(1, initial=0.0) > 0)
    active[fallback] = _top(spare_score[fallback], count[fallback])
    return active


def _top(score: np.ndarray, count: np.ndarray) -> np.ndarray:
    """bool ``[frames, n]``: per frame, the ``count`` highest of ``score`` (ties: lower index first) that
    are above 0."""
    order = np.argsort(-score, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(score.shape[1]), score.shape), axis=1)
    return (rank < count[:, None]) & (score > 0)


def _fill_silent_regions(active, speech, num):
    """Speech regions where no chunk hears a speaker (Silero-only regions) go to the nearest speaker."""
    idx = np.flatnonzero(active.any(1))
    for a, b in _region_frames(speech, num):
        if b <= a or active[a:b].any():
            continue
        if idx.size == 0:
            active[a:b, 0] = True
            continue
        near = idx[np.abs(idx - (a + b) // 2).argmin()]
        active[a:b, int(np.argmax(active[near]))] = True
    return active


def _clip(turns: list[Turn], speech: list[tuple[float, float]]) -> list[Turn]:
    """Turns cut to the speech regions (sorted, disjoint); an end within one frame of a region edge
    moves onto the edge (frame edges fall between region edges)."""
    starts = np.array([s for s, _ in speech])
    ends = np.array([e for _, e in speech])
    out = []
    for t in turns:
        for i in range(int(np.searchsorted(ends, t.start, "right")), int(np.searchsorted(starts, t.end))):
            s, e = speech[i]
            a, b = max(t.start, s), min(t.end, e)
            if b - a > 1e-6:
                a = s if a - s < DT else a
                b = e if e - b < DT else b
                out.append(Turn(round(a, 3), round(b, 3), t.speaker))
    return out


def diarize(wave: np.ndarray, speech: list[tuple[float, float]], num_speakers: int | None = None,
            min_speakers: int | None = None, max_speakers: int | None = None, embedder=None,
            threshold: float | None = None, device: str = "cpu",
            should_cancel: ShouldCancel = None, stage=None) -> list[Turn]:
    """Who speaks when, within the given speech regions.

    Args:
        wave: float32 ``[n]`` mono PCM at 16 kHz.
        speech: speech regions ``(start, end)`` in seconds, sorted and disjoint (``detect_speech``).
        num_speakers: exact speaker count; min_speakers / max_speakers: bounds on the automatic count.
            The turns hold exactly ``num_speakers`` (at least ``min_speakers``, at most
            ``max_speakers``) whenever the speech gives that many embedding windows (step 5 above).
        embedder: an object with ``name`` and ``embed(wave, windows[, masks]) -> [n, d]`` (default CAM++);
            anything but CAM++ uses the window pipeline (``windows.py``).
        threshold: clustering cut (cosine distance); default ``THRESHOLD`` (window pipeline: its own).
        device: where segmentation and the default embedder run (``"cpu"`` or the engine's CUDA device).
        should_cancel: polled between the stages and inside segmentation and embedding (CAM++ path).
        stage: a ``stage.SpeakerStage``: segmentation-3.0 and CAM++ run there, in batches shared with other
            recordings (the same results up to float order); ``None`` runs them per recording on ``device``
            (the reference path).
    Returns:
        Turns sorted by start, inside the speech regions, speakers ``0..k-1`` numbered by first
        appearance; turns of different speakers may overlap. ``[]`` when there is no speech.
    Raises:
        ValueError: inconsistent speaker-count hints.
        Canceled: ``should_cancel()`` returned True; nothing is returned.
    """
    check_hints(num_speakers, min_speakers, max_speakers)
    wave = np.asarray(wave, dtype=np.float32).reshape(-1)
    duration = wave.size / SAMPLE_RATE
    speech = [(max(0.0, float(s)), min(duration, float(e))) for s, e in speech]
    speech = [(s, e) for s, e in speech if e - s >= MIN_REGION_S]
    if not speech:
        return []
    check(should_cancel)
    embedder = embedder or (stage.embedder if stage is not None else default_embedder(device))
    try:
        if embedder.name != "campplus":
            raise LookupError(embedder.name)
        offsets, probs = segment_cached(wave, device=device, should_cancel=should_cancel,
                                        segmenter=None if stage is None else stage.segment)
    except (FileNotFoundError, LookupError):
        from transcription.diarization.windows import diarize_windows

        turns = diarize_windows(wave, speech, num_speakers, min_speakers, max_speakers, embedder, threshold)
        check(should_cancel)
        return turns
    num = grid_size(wave.size, offsets, probs.shape[1])
    in_speech = _speech_mask(speech, num)
    frames = offsets[:, None] + np.arange(probs.shape[1])[None, :]
    valid = (frames >= 0) & (frames < num) & in_speech[np.clip(frames, 0, num - 1)]
    act = to_multilabel(probs) * valid[..., None]

    items, clean_s, solo_frames, emb = _embed_local_speakers(wave, offsets, act, embedder, should_cancel)
    check(should_cancel)
    wanted = lower_bound(implied_speakers(items, clean_s), num_speakers, min_speakers, max_speakers)
    if items:
        thr = THRESHOLD if threshold is None else threshold
        cent = _cluster(emb, clean_s, solo_frames, thr, num_speakers,
                        None if num_speakers is not None else wanted, max_speakers)
        assigned = assign_to_centroids(emb, cent, [c for c, _ in items])
        nearest = np.argmax(emb @ cent.T, axis=1)  # before the overlap speakers: they take no spare frames
        cent, assigned = add_overlap_speakers(
            emb, cent, assigned, overlapping_unassigned(act, items, assigned, round(MIN_ACTIVE_S / DT)),
            thr, _room(len(cent), num_speakers, max_speakers))
        active = _reconstruct(offsets, act, items, assigned, num, len(cent), in_speech, nearest)
    else:
        active = np.zeros((num, 1), bool)
    active = _fill_silent_regions(active, speech, num)
    turns = number_by_appearance(_clip(activity_to_turns(active, frame_edges(num)), speech))
    if len({t.speaker for t in turns}) < wanted:
        # Fewer speakers hold a frame than are asked for (or than two local speakers of one chunk prove):
        # the voices share local speakers of segmentation-3.0 (dev00: two talkers in one local speaker in
        # 9 of 10 chunks), so the reconstruction cannot separate them. Embeddings of short windows can:
        # the window pipeline, at exactly that count (docs/diarization.md: "Overlapped speech and speaker counts").
        from transcription.diarization.windows import diarize_windows

        turns = diarize_windows(wave, speech, wanted, embedder=embedder, threshold=threshold,
                                should_cancel=should_cancel)
        check(should_cancel)
    return turns
