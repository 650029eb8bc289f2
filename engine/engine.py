"""The engine: one model, one KV cache, one scheduler loop, many concurrent sequences."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

import torch

from engine.attention import GraphCapableBackend, make_backend
from engine.config import EngineConfig
from engine.encoder_manager import EncoderManager
from engine.loaders import LoadedModel, load_model
from engine.logits_rules import install_logits_rules
from engine.memory_plan import plan_memory
from engine.ops.linear import LinearKernels, set_linear_kernels
from engine.overlap import LookaheadSteps
from engine.request import FinishReason, Sequence
from engine.resolve import default_cpu_threads, describe, resolve_config
from engine.runner import ModelRunner
from engine.scheduler import Scheduler
from engine.step_loop import StepLoop

log = logging.getLogger("diarist.engine")

CANCEL_POLL_S = 0.05
"""Seconds between two looks at a waiter's ``should_cancel``: the longest a cancel waits to abort its work."""


class Engine:
    """Continuous-batching inference engine.

    Use it inline (``submit`` then ``run_until_done``) or with a background loop (``start``); ``submit`` and
    ``abort`` are thread-safe. Steps run in :class:`engine.step_loop.StepLoop`. Events of a :class:`Sequence`
    with an :class:`~engine.request.EventInbox` reach its ``on_event`` on the thread that waits
    (:meth:`run_until_done`); without one, ``on_event`` is called from the loop thread.

    The configuration is resolved for the device and checkpoint first (:func:`engine.resolve.resolve_config`);
    ``self.config`` is the resolved one.

    Raises (constructor):
        DeviceUnavailable: the device is not there. CheckpointError / ValueError: the model cannot be
        loaded; ValueError: the KV budget is too small, or a choice does not fit the device.
    """

    def __init__(self, config: EngineConfig | None = None, loaded: LoadedModel | None = None) -> None:
        self.config = cfg = resolve_config(config or EngineConfig())
        if cfg.device == "cpu":
            torch.set_num_threads(cfg.threads or default_cpu_threads())
        self.device = torch.device(cfg.device)
        self.loaded = loaded or load_model(cfg)
        self.model = self.loaded.model
        set_linear_kernels(self.model, LinearKernels(gemv_max_rows=1 if cfg.small_batch_gemv else 0,
                                                     fused_gelu_gemm=bool(cfg.fused_gelu_gemm),
                                                     fused_norm_gemv=bool(cfg.fused_decode_gemv)))
        self.tokenizer = self.loaded.tokenizer
        self.dtype = next(self.model.parameters()).dtype
        self.max_context = min(cfg.max_context or self.model.max_context, self.model.max_context)
        plan = plan_memory(self.model, cfg, self.max_context, self.dtype, self.device)
        self.kv, self.allocator, self.table, self.cross = plan.kv, plan.allocator, plan.table, plan.cross
        self.max_reqs, self.kv_bytes_per_token = plan.max_reqs, plan.kv_bytes_per_token
        install_logits_rules(self.model, self.loaded.info.get("greedy_rules"), self.max_reqs + 1, self.device)
        self.attn = make_backend(cfg.attention_backend, cfg, kv=self.kv, table=self.table, cross=self.cross)
        self.scheduler = Scheduler(self.allocator, self.table, self.max_context, cfg.chunk_size, self.max_reqs,
                                   class_limits=cfg.admission_limits)
        self.runner = ModelRunner(self.model, self.attn, self.table, self.device)
        # resolve_config leaves cuda_graph_max_bs > 0 only on CUDA with a graph-capable backend
        graphs = cfg.cuda_graph_max_bs > 0 and self.device.type == "cuda"
        if graphs and isinstance(self.attn, GraphCapableBackend):
            buckets = tuple(b for b in cfg.prefill_graph_tokens if b <= cfg.chunk_size)
            self.runner.capture_graphs(min(cfg.cuda_graph_max_bs, self.max_reqs),
                                       buckets if self.cross is None else (),  # cross-attention: eager prefill
                                       min(cfg.prefill_graph_max_items, self.max_reqs), self.model.hidden_size,
                                       self.dtype)
        log.info("engine ready: %s on %s, %s", self.loaded.info.get("name"), self.device,
                 ", ".join(f"{k}={v}" for k, v in describe(cfg).items() if k != "device"))
        if self.random_weights:
            log.warning("engine runs RANDOM weights (load_format=dummy): every transcript is noise; "
                        "load a checkpoint for real output")
        # Steps run on a stream of the highest priority: when decode and encoder kernels are both queued, the
        # block scheduler dispatches the decode's first, so the encoder fills the SMs a latency-bound decode
        # step leaves idle instead of delaying it (the encoder stream keeps the default, lowest priority).
        self._stream = None
        if self.device.type == "cuda" and cfg.priority_stream:
            self._stream = torch.cuda.Stream(self.device, priority=-100)  # clamped to the highest
        lookahead = (LookaheadSteps(self.runner, self.scheduler, self.device, self.max_reqs + 1)
                     if cfg.async_decode else None)
        self.loop = StepLoop(self.scheduler, self.runner, self.model, self.cross, lookahead)
        # Audio requests pass through the encoder stage (windows batched across requests under a per-step
        # budget, encoder CUDA graphs, output cache, own stream) before the scheduler sees them.
        self.encoder = EncoderManager.for_engine(self)
        # Submissions and aborts come from request threads through two inboxes the loop drains before each
        # step; an abort is not a request, so only the first counts as waiting (stats).
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._lock = threading.Lock()
        if self._stream is not None:  # everything built above (weights, KV, graph and loop buffers) first
            self._stream.wait_stream(torch.cuda.current_stream(self.device))

    @property
    def fallbacks(self) -> list[str]:
        """Fast paths of the model that failed to set up, and what runs instead (``ModelRunner.fallbacks``)."""
        return self.runner.fallbacks

    @property
    def random_weights(self) -> bool:
        """True when the weights are random (``load_format="dummy"``): transcripts are noise."""
        return bool(self.loaded.info.get("random_weights"))

    def kv_tokens_needed(self, seq: Sequence) -> int:
        """KV tokens the sequence would reserve (prompt + output budget), known before admission."""
        return self.scheduler.kv_needed(seq)

    # -- requests ------------------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> Sequence:
        """Validate and queue a sequence (thread-safe).

        Raises:
            RequestRejected: empty prompt (``too_short``), prompt longer than the context (``too_long``)
                or larger than the KV cache (``kv_capacity``).
        """
        self.scheduler.validate(seq)
        self.encoder.on_submit(seq)  # waveform hash and pinning on the caller's thread, not the loop's
        self._inbox.put(seq)
        self._wake.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """End a sequence now (thread-safe; idempotent); its KV is freed before the next step."""
        self._aborts.put(seq)
        self._wake.set()

    def _drain(self) -> None:
        # submissions first: an abort always follows its sequence's submission, possibly in the same drain
        while True:
            try:
                seq = self._inbox.get_nowait()
            except queue.Empty:
                break
            if not self.encoder.add(seq):  # audio to encode first: the encoder stage holds it
                self.scheduler.waiting.append(seq)
            seq.emit("queued")
        while True:
            try:
                seq = self._aborts.get_nowait()
            except queue.Empty:
                break
            if not seq.finished:
                self.encoder.discard(seq)
                self.scheduler.finish(seq, FinishReason.ABORT)
                seq.emit("finished", seq.finish_reason)
        ready, failed = self.encoder.step()  # launch this step's windows; encoded sequences may now queue
        self.scheduler.waiting.extend(ready)
        for seq in failed:
            self.scheduler.finish(seq, FinishReason.ERROR)
            seq.emit("finished", seq.finish_reason)

    # -- the loop ------------------------------------------------------------------------------------
    def _on_stream(self):
        return torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()

    def step(self) -> bool:
        """Run one step of the loop (:class:`engine.step_loop.StepLoop`). Returns False when there was
        nothing to do."""
        with self._lock, self._on_stream():
            self._drain()
            return self.loop.step()

    def run_until_done(self, seqs: list[Sequence], timeout_s: float | None = None,
                       should_cancel: Callable[[], bool] | None = None) -> list[Sequence]:
        """Wait (or step inline when no loop thread runs) until every seq has finished.

        Sequences with an :class:`~engine.request.EventInbox` have their events delivered on this thread
        while it waits (it sleeps on the inbox, or on the sequences' ``done``, never busy-polls). Returns
        once each seq's ``finished`` event has been emitted and delivered. ``should_cancel`` is polled at
        least every ``CANCEL_POLL_S`` while waiting; once it returns True every unfinished seq is aborted
        (finish_reason ``abort``, KV freed) and the call returns when they have ended.

        Raises:
            TimeoutError: not finished within ``timeout_s`` seconds.
        """
        self._wait(seqs, all, timeout_s, should_cancel)
        return seqs

    def run_until_any_done(self, seqs: list[Sequence], timeout_s: float | None = None,
                           should_cancel: Callable[[], bool] | None = None) -> list[Sequence]:
        """As :meth:`run_until_done`, but return as soon as at least one of ``seqs`` has finished (its
        ``done`` set; at once when one already has): the finished ones, in the order given. A cancel aborts
        all of them. Give the sequences an :class:`~engine.request.EventInbox` to be woken at each end.

        Raises:
            TimeoutError: none finished within ``timeout_s`` seconds.
        """
        if seqs:
            self._wait(seqs, any, timeout_s, should_cancel)
        return [s for s in seqs if s.done.is_set()]

    def _wait(self, seqs: list[Sequence], enough: Callable, timeout_s: float | None,
              should_cancel: Callable[[], bool] | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        inboxes = list({id(s.inbox): s.inbox for s in seqs if s.inbox is not None}.values())
        canceled = False
        while True:
            if enough(s.done.is_set() for s in seqs):
                for box in inboxes:  # "finished" is queued before done is set: deliver what is left
                    box.deliver(0)
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("sequences did not finish in time")
            if not canceled and should_cancel is not None and should_cancel():
                canceled = True
                for s in seqs:
                    if not s.finished:
                        self.abort(s)
            if self._thread is None:
                if not self.step() and not enough(s.done.is_set() for s in seqs):
                    with self._on_stream():
                        self._drain()
                for box in inboxes:
                    box.deliver(0)
            elif inboxes:
                inboxes[0].deliver(CANCEL_POLL_S)
                for box in inboxes[1:]:
                    box.deliver(0)
            else:
                # without an inbox, a wait for any of several sequences notices the others' ends only
                # every CANCEL_POLL_S: give such requests an inbox (it wakes at every "finished")
                next(s for s in seqs if not s.done.is_set()).done.wait(CANCEL_POLL_S)

    def generate(self, seqs: list[Sequence]) -> list[Sequence]:
        """Submit and run ``seqs`` to completion (convenience for tests and the CLI)."""
        for s in seqs:
            self.submit(s)
        return self.run_until_done(seqs)

    def start(self) -> None:
        """Run the step loop on a daemon thread until :meth:`shutdown`."""
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="diarist-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            if not self.step():
                # encoder work still on the GPU: poll again soon; otherwise sleep until a request comes
                self._wake.wait(0.0005 if self.encoder.has_work() else 0.05)
                self._wake.clear()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- observability -------------------------------------------------------------------------------
    @property
    def counters(self) -> dict[str, int]:
        """The step loop's counters (:attr:`engine.step_loop.StepLoop.counters`)."""
        return self.loop.counters

    def stats(self) -> dict:
        """Engine gauges and counters for /stats, metrics and the dashboard. ``kv_tokens_used`` counts the KV
        slots held by running sequences: each holds its whole reservation (prompt + output budget) from
        admission to finish."""
        tokens_per_s, steps_per_s = self.loop.rates(time.perf_counter())
        total = self.allocator.num_slots
        used = total - self.allocator.num_free
        return {
            "model": self.loaded.info.get("name"),
            "random_weights": self.random_weights,
            **({"generation": self.loaded.info["greedy_rules"].describe()}
               if self.loaded.info.get("greedy_rules") is not None else {}),
            **({"chat_template": getattr(self.loaded.info["chat_template"], "source", None) or "built-in"}
               if "chat_template" in self.loaded.info else {}),
            **({"marker_interval_s": self.loaded.info["marker_every_s"],
                "marker_interval_source": self.loaded.info.get("marker_source")}
               if "marker_every_s" in self.loaded.info else {}),
            "device": str(self.device),
            "running_requests": len(self.scheduler.running),
            "waiting_requests": len(self.scheduler.waiting) + self._inbox.qsize() + self.encoder.num_pending,
            "kv_tokens_total": total,
            "kv_tokens_used": used,
            # what the pool stores and costs (config.kv_dtype says what was asked: "auto" = the compute dtype)
            "kv_storage_dtype": str(self.kv.dtype).removeprefix("torch."),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_running_requests": self.max_reqs,
            "kv_used_fraction": used / total if total else 0.0,
            "tokens_per_s": tokens_per_s,
            "steps_per_s": steps_per_s,
            "cuda_graph_replays": getattr(self.runner.graphs, "replays", 0) if self.runner.graphs else 0,
            "prefill_graph_replays": getattr(self.runner.prefill_graphs, "replays", 0),
            "config": describe(self.config),
            "fallbacks": list(self.fallbacks + self.encoder.fallbacks),
            **self.encoder.stats(),
            **self.counters,
        }
