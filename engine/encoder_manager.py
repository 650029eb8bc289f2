"""The engine's encoder stage: audio of new requests is encoded here before the scheduler sees them.

Why a stage of its own: encoding a recording at admission (in the step that admits it) stalls every
running decode for the whole encoder pass; a 90-minute recording is 180 Whisper-medium windows, which in
one eager pass also ran out of memory at a peer (sgl-project/sglang-omni #1189, #1426). Here:

* Each engine step launches at most ``window_budget`` windows, taken in arrival order from all waiting
  recordings (windows of many requests share one forward; a long recording spreads over many steps). A
  microbatch of ``k`` windows replays the CUDA graph captured for exactly ``k`` (:mod:`engine.encoder_graphs`)
  or runs eagerly.
* A recording's window outputs are written into its own ``[W, 1500, d]`` buffer; after its last window the
  model merges 4 frames and runs the adapter over the whole recording (``merge_and_adapt``), and only then
  does the sequence join the scheduler's waiting queue (prefill never starts on missing embeddings).
* On CUDA the work runs on a separate stream: launches return at once, decode steps keep running, and the
  stage polls a CUDA event per microbatch; a sequence is handed over once its event has completed (the
  main stream also waits on that event and the embeddings are marked as used by it, so the allocator
  never recycles them early). At most ``2 * window_budget`` windows are in flight, bounding memory.
* Cache: the key (:func:`engine.encoder_cache.audio_fingerprint`) is computed in ``Engine.submit`` on the
  caller's thread, before any mel. A hit is copied back from host memory asynchronously and skips the
  encoder; a recording identical to one being encoded waits for that one instead (encoded once). Each
  encoded recording's embeddings are copied to pinned host memory in the same launch and stored when
  its event completes. That pinned buffer is allocated on the caller's thread too: pinning is slow
  (``cudaHostAlloc`` took 109 ms for a 90-minute recording's 138 MB on an H200), and on the loop it held
  up the hand-over and every running decode.

Models opt in by satisfying :class:`engine.models.interface.AudioPromptModel` (MOSS-TD). Other models (Whisper: its encoder output goes straight into the cross-attention rows of
admitted requests) and the ``meta`` device (memory planning only) keep the encode-at-admission path.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.encoder_cache import EncoderCache, audio_fingerprint
from engine.encoder_graphs import EncoderGraphs, compile_encoder
from engine.models.interface import AudioPromptModel
from engine.models.mel import CHUNK_SAMPLES
from engine.models.moss_td_prompt import window_token_counts
from engine.request import Sequence

log = logging.getLogger("diarist.engine")


@dataclass(eq=False)
class _Job:
    """One distinct recording; ``seqs`` are the requests that carry it (more than one when deduplicated)."""

    seqs: list[Sequence]
    wave: torch.Tensor  # float32 [n] on the host
    counts: list[int]  # audio tokens per 30 s window
    key: bytes | None
    t0: float = field(default_factory=time.perf_counter)
    launched: int = 0  # windows handed to the encoder so far
    cached: bool = False  # served from the cache: ``host`` is the cached value
    windows: torch.Tensor | None = None  # float32 [W, 480000] on the device, zero-padded
    states: torch.Tensor | None = None  # [W, 1500, d] encoder outputs
    emb: torch.Tensor | None = None  # [N, hidden] embeddings, set by the launch of the last window
    host: torch.Tensor | None = None  # host copy of ``emb`` for the cache (pinned buffer from the submit)

    @property
    def num_windows(self) -> int:
        return len(self.counts)


@dataclass
class _Launch:
    """Work put on the encoder stream in one go: window slices ``parts`` and the recordings it completes."""

    event: torch.cuda.Event | None
    finishing: list[_Job]
    windows: int


class EncoderManager:
    """Encoder stage between :meth:`Engine.submit` and the scheduler.

    Args:
        model: the loaded model; the stage is enabled only for an :class:`AudioPromptModel`.
        device: where the model lives (``meta`` disables the stage).
        window_budget: windows launched per engine step (0 disables the stage).
        cache: host LRU cache of embeddings (``None``: no cache, no deduplication).
        graphs: captured encoder graphs, or ``None`` (eager).
        stream: CUDA stream for the encoder, or ``None`` (the current stream).
        model_id: mixed into cache keys.
        encoder_fn: the encoder callable for eager microbatches (default: ``model.audio_encoder``).
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, window_budget: int = 8,
                 cache: EncoderCache | None = None, graphs: EncoderGraphs | None = None,
                 stream: torch.cuda.Stream | None = None, model_id: str = "",
                 encoder_fn=None) -> None:
        audio_prompt = isinstance(model, AudioPromptModel)
        self.enabled = window_budget > 0 and device.type != "meta" and audio_prompt
        self.model = model
        self.device = device
        self.window_budget = window_budget
        self.cache = cache if cache is not None else EncoderCache(0, 0)
        self.graphs = graphs
        self.stream = stream
        self.model_id = model_id
        if encoder_fn is None and audio_prompt:
            encoder_fn = model.audio_encoder
        self.encoder_fn = encoder_fn
        self.max_microbatch = max(graphs.buckets) if graphs is not None and graphs.graphs else window_budget
        # (hidden, dtype) of the embeddings, for the pinned buffer made at submit: merge_and_adapt of no
        # windows returns an empty [0, hidden] tensor of the model's dtype.
        self.emb_spec = None
        if self.enabled:
            empty = model.merge_and_adapt(torch.empty(0, device=device), [])
            self.emb_spec = (int(empty.shape[-1]), empty.dtype)
        self.queue: deque[_Job] = deque()  # windows not yet launched, arrival order
        self.copies: deque[_Job] = deque()  # cache hits waiting for their copy back
        self.inflight: deque[_Launch] = deque()
        self.by_key: dict[bytes, _Job] = {}
        self.job_of: dict[Sequence, _Job] = {}
        self.windows_in_flight = 0
        self.fallbacks: list[str] = []  # set-up that failed (engine stats)
        self.counters = {"encoder_windows": 0, "encoder_microbatches": 0, "encoder_graph_replays": 0,
                         "encoder_dedup_hits": 0}

    @classmethod
    def for_engine(cls, engine) -> EncoderManager:
        """Build the stage from ``engine.config`` (``encoder_*`` fields); captures the encoder graphs on
        CUDA. Raises RuntimeError from CUDA when capture fails."""
        cfg, model, dev = engine.config, engine.model, engine.device
        cache = EncoderCache(cfg.encoder_cache_entries, cfg.encoder_cache_bytes)
        mgr = cls(model, dev, cfg.encoder_window_budget, cache, model_id=_model_id(engine))
        if not mgr.enabled or dev.type != "cuda":
            return mgr
        buckets = list(cfg.encoder_graph_buckets)
        if cfg.encoder_compile:
            limit = max(len(buckets), cfg.encoder_window_budget)
            mgr.encoder_fn = compile_encoder(model.audio_encoder, limit)
        mgr.stream = torch.cuda.Stream(dev) if cfg.encoder_stream else None
        if buckets:
            graphs = EncoderGraphs(model.window_mel, mgr.encoder_fn, dev, buckets,
                                   cfg.encoder_graph_min_free_bytes)
            try:
                graphs.capture(mgr.stream)
            except Exception as e:  # noqa: BLE001 - the encoder then runs eagerly; loudly (log + stats)
                mgr.fallbacks.append(f"encoder CUDA graphs: {type(e).__name__}: {e}")
                log.error("encoder CUDA graphs could not be captured, encoding eagerly: %s: %s",
                          type(e).__name__, e)
                return mgr
            mgr.graphs = graphs
            mgr.max_microbatch = max(graphs.graphs, default=cfg.encoder_window_budget)
        return mgr

    # -- requests ------------------------------------------------------------------------------------
    def on_submit(self, seq: Sequence) -> None:
        """On the submitting thread: pin the waveform (CUDA), compute its cache key and pin the host buffer
        its embeddings will be cached in, so neither the hash nor any pinning or pageable copy runs on the
        engine loop."""
        if not self.enabled or "audio" not in seq.mm_inputs:
            return
        wave = torch.as_tensor(seq.mm_inputs["audio"]).flatten().to(torch.float32)
        if self.device.type == "cuda":
            wave = wave.pin_memory()
        seq.mm_inputs["audio"] = wave
        if self.cache.enabled:
            key = seq.mm_state["audio_key"] = audio_fingerprint(wave, self.model_id)
            # A recording already cached needs no buffer (if it is evicted before the loop takes it, the
            # loop pins one itself: slower, still correct).
            if self.device.type == "cuda" and key not in self.cache:
                hidden, dtype = self.emb_spec
                n = sum(window_token_counts(int(wave.numel())))
                seq.mm_state["audio_host"] = torch.empty((n, hidden), dtype=dtype, pin_memory=True)

    def add(self, seq: Sequence) -> bool:
        """Take a new sequence if it has audio to encode; False leaves it to the scheduler as is."""
        if not self.enabled or "audio" not in seq.mm_inputs:
            return False
        wave = torch.as_tensor(seq.mm_inputs.pop("audio")).flatten().to(torch.float32)
        key = seq.mm_state.pop("audio_key", None)
        host_buf = seq.mm_state.pop("audio_host", None)
        if key is None and self.cache.enabled:
            key = audio_fingerprint(wave, self.model_id)
        job = self.by_key.get(key) if key is not None else None
        if job is not None:  # the same audio is being encoded or copied back: share its result
            job.seqs.append(seq)
            self.counters["encoder_dedup_hits"] += 1
        else:
            job = _Job([seq], wave, window_token_counts(int(wave.numel())), key)
            host = self.cache.get(key) if key is not None else None
            if host is not None:
                job.cached, job.host = True, host
                self.copies.append(job)
            else:
                job.host = host_buf
                self.queue.append(job)
            if key is not None:
                self.by_key[key] = job
        self.job_of[seq] = job
        return True

    def discard(self, seq: Sequence) -> None:
        """Forget an aborted sequence. A recording nobody waits for any more launches no further windows
        (a 90-minute one stops at once); a microbatch already launched completes and, if it finished the
        recording, is still cached."""
        job = self.job_of.pop(seq, None)
        if job is None:
            return
        job.seqs.remove(seq)
        if not job.seqs and job in self.queue:
            self.queue.remove(job)
            self._forget_key(job)
            job.windows = job.states = None  # stream-ordered reuse: pending kernels read them first

    def has_work(self) -> bool:
        return bool(self.queue or self.copies or self.inflight)

    @property
    def num_pending(self) -> int:
        """Sequences waiting in the encoder stage."""
        return len(self.job_of)

    # -- one step ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        """Launch this step's copies and windows, then collect completed recordings.

        Returns:
            ``(ready, failed)``: sequences whose embeddings are attached (for the scheduler's waiting
            queue, in completion order) and sequences that failed (``seq.error`` set; the caller ends them).
        """
        if not self.has_work():
            return [], []
        failed: list[Sequence] = []
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with ctx:
            while self.copies:
                self._launch_copy(self.copies.popleft())
            budget = self.window_budget
            while self.queue and budget > 0 and self.windows_in_flight < 2 * self.window_budget:
                parts = self._take(min(budget, self.max_microbatch))
                n = sum(hi - lo for _, lo, hi in parts)
                budget -= n
                try:
                    self._launch(parts, n)
                except Exception as e:  # a failed microbatch ends its requests, never the engine
                    log.exception("encoder microbatch failed")
                    for job in {id(j): j for j, _, _ in parts}.values():
                        failed += self._fail(job, f"{type(e).__name__}: {e}")
        ready, late = self._poll()
        return ready, failed + late

    def _take(self, k: int) -> list[tuple[_Job, int, int]]:
        """Up to ``k`` windows from the head of the queue as ``(job, first, end)`` slices."""
        parts = []
        while self.queue and k > 0 or (self.queue and self.queue[0].num_windows == 0):
            job = self.queue[0]
            take = min(k, job.num_windows - job.launched)
            parts.append((job, job.launched, job.launched + take))
            job.launched += take
            k -= take
            if job.launched == job.num_windows:
                self.queue.popleft()
        return parts

    def _launch(self, parts: list[tuple[_Job, int, int]], n: int) -> None:
        dev = self.device
        xs = []
        for job, lo, hi in parts:
            if job.windows is None and job.num_windows:
                wave = job.wave.to(dev, non_blocking=True)
                pad = job.num_windows * CHUNK_SAMPLES - wave.numel()
                job.windows = F.pad(wave, (0, pad)).view(job.num_windows, CHUNK_SAMPLES)
            if hi > lo:
                xs.append(job.windows[lo:hi])
        if xs:
            out = self._encode(xs[0] if len(xs) == 1 else torch.cat(xs))
            off = 0
            for job, lo, hi in parts:
                if hi > lo:
                    if job.states is None:
                        job.states = out.new_empty(job.num_windows, *out.shape[1:])
                    job.states[lo:hi].copy_(out[off : off + hi - lo])
                    off += hi - lo
        finishing = []
        for job, _, hi in parts:
            if hi == job.num_windows:
                job.emb = self.model.merge_and_adapt(job.states, job.counts)
                job.windows = job.states = None
                if job.key is not None and self.cache.enabled:
                    job.host = self._to_host(job.emb, job.host)
                else:
                    job.host = None
                finishing.append(job)
        self._record(finishing, n)
        self.counters["encoder_windows"] += n
        self.counters["encoder_microbatches"] += bool(n)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        if self.graphs is not None and x.shape[0] in self.graphs:
            self.counters["encoder_graph_replays"] += 1
            return self.graphs(x)
        return self.encoder_fn(self.model.window_mel(x))

    def _to_host(self, emb: torch.Tensor, buf: torch.Tensor | None) -> torch.Tensor:
        """Start copying ``emb`` into ``buf`` (the pinned buffer made at submit) or, when that is missing or
        of another shape, a new pinned one; the copy is done when this launch's event completes."""
        if emb.device.type != "cuda":
            return emb.clone()
        if buf is None or buf.shape != emb.shape or buf.dtype != emb.dtype:
            buf = torch.empty(emb.shape, dtype=emb.dtype, pin_memory=True)
        buf.copy_(emb, non_blocking=True)
        return buf

    def _launch_copy(self, job: _Job) -> None:
        cuda = self.device.type == "cuda"
        job.emb = job.host.to(self.device, non_blocking=True) if cuda else job.host.clone()
        self._record([job], 0)

    def _record(self, finishing: list[_Job], windows: int) -> None:
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self.inflight.append(_Launch(event, finishing, windows))
        self.windows_in_flight += windows

    def _poll(self) -> tuple[list[Sequence], list[Sequence]]:
        ready: list[Sequence] = []
        failed: list[Sequence] = []
        while self.inflight and (self.inflight[0].event is None or self.inflight[0].event.query()):
            launch = self.inflight.popleft()
            self.windows_in_flight -= launch.windows
            for job in launch.finishing:
                self._finish(job, launch.event, ready, failed)
        return ready, failed

    def _finish(self, job: _Job, event, ready: list, failed: list) -> None:
        self._forget_key(job)
        if job.host is not None and not job.cached:
            self.cache.put(job.key, job.host)
        if event is not None and job.seqs:  # order the hand-over and keep the allocator honest
            main = torch.cuda.current_stream(self.device)
            main.wait_event(event)
            job.emb.record_stream(main)
        dt = time.perf_counter() - job.t0
        for seq in job.seqs:
            self.job_of.pop(seq, None)
            seq.timings.encoder_s += dt
            try:
                self.model.attach_audio(seq, job.emb)
                ready.append(seq)
            except ValueError as e:
                seq.error = f"ValueError: {e}"
                failed.append(seq)

    def _fail(self, job: _Job, error: str) -> list[Sequence]:
        if job in self.queue:
            self.queue.remove(job)
        self._forget_key(job)
        job.windows = job.states = None
        out = []
        for seq in job.seqs:
            self.job_of.pop(seq, None)
            seq.error = error
            out.append(seq)
        job.seqs = []
        return out

    def _forget_key(self, job: _Job) -> None:
        if job.key is not None and self.by_key.get(job.key) is job:
            del self.by_key[job.key]

    # -- observability -------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Cache counters (``encoder_cache_*``), windows encoded, microbatches, graph replays, dedup hits,
        and sequences waiting in the stage."""
        return {**self.cache.stats(), **self.counters, "encoder_pending_requests": self.num_pending}


def _model_id(engine) -> str:
    cfg = engine.config
    name = engine.loaded.info.get("name")
    return f"{cfg.model}|{cfg.model_path}|{cfg.load_format}|{cfg.dtype}|{name}|{cfg.seed}"
