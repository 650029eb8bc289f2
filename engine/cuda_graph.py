"""Decode CUDA graphs by batch-size bucket: capture once at engine start, replay every decode step.

A decode step (every item has one new token) of ``B`` sequences replays the graph of the smallest bucket
``>= B``. Rows ``B..bucket-1`` are padding: token 0 at position 0 of ``req_to_token`` row 0 with length 1,
writing its K/V to the dummy slot 0, so they never touch a live sequence. Greedy sampling (argmax) runs
inside the graph; the logits stay on the device unless a caller asks for them.

The graphs are captured on a capture stream of their own. PyTorch hands cuBLAS/cuBLASLt a workspace keyed by
(handle, *current* stream), and under capture that is the capture stream, so its address is baked into every
graph captured there. ``torch.cuda.graph`` defaults to one process-wide capture stream: the encoder graphs
(:mod:`engine.encoder_graphs`) captured there too would share the decode graphs' workspace while the two
replay concurrently (encoder stream vs. main stream), which cuBLAS forbids (one workspace per concurrently
running stream): split-K partials and reduction state of one GEMM get overwritten by the other's.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable

import torch

from engine.attention.base import AttentionBackend, ForwardBatch

log = logging.getLogger("diarist.engine")


def default_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, 48, 64, then every 32 up to ``max_batch_size`` (always included)."""
    base = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    out = [b for b in base if b <= max_batch_size]
    b = 96
    while b <= max_batch_size:
        out.append(b)
        b += 32
    if not out or out[-1] != max_batch_size:
        out.append(max_batch_size)
    return out


def capture_logits_graph(model: torch.nn.Module, attn: AttentionBackend, batch: ForwardBatch, pool,
                         stream: torch.cuda.Stream | None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
    """Warm up ``model(batch, attn)`` twice (compiles the Triton kernels for these shapes and settles the
    allocator), then capture it with greedy sampling into ``pool`` on ``stream``. The backend's metadata
    must already point at static buffers. Returns ``(graph, logits float32 [B, vocab], greedy int64 [B])``,
    the outputs being the graph's static tensors. Raises RuntimeError from CUDA when capture fails."""
    for _ in range(2):
        model(batch, attn)
    torch.cuda.synchronize(batch.input_ids.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        logits = model(batch, attn)
        greedy = logits.argmax(dim=-1)
    return graph, logits, greedy


def capture_buckets(model: torch.nn.Module, attn: AttentionBackend, buckets: list[int],
                    prepare: Callable[[int], None], static_batch: Callable[[int], ForwardBatch],
                    stream: torch.cuda.Stream | None) -> dict[int, tuple]:
    """One :func:`capture_logits_graph` per bucket, largest first, all in the first graph's memory pool
    (a smaller graph fits in what the largest allocated). ``prepare(b)`` points the backend's metadata at
    its static buffers for bucket ``b``; ``static_batch(b)`` is the batch over the static inputs.
    Returns ``{bucket: (graph, logits, greedy)}``. Raises RuntimeError from CUDA when a capture fails."""
    graphs: dict[int, tuple] = {}
    pool = None
    for b in sorted(buckets, reverse=True):
        prepare(b)
        graphs[b] = capture_logits_graph(model, attn, static_batch(b), pool, stream)
        pool = graphs[b][0].pool()
    return graphs


class DecodeGraphs:
    """Captured decode graphs for one model and attention backend.

    Static inputs: ``input_ids``/``positions``/``token_rows`` int64 ``[max_bs]`` (here) and the backend's row,
    length and slot buffers (:meth:`GraphCapableBackend.init_graph_capture`). Outputs per bucket: float32 logits
    ``[bucket, vocab]`` and int64 greedy ids ``[bucket]``.

    Raises (``capture``): RuntimeError from CUDA or the backend when a graph cannot be captured.
    """

    def __init__(self, model: torch.nn.Module, attn: AttentionBackend, device: torch.device,
                 max_batch_size: int, buckets: list[int] | None = None) -> None:
        self.model = model
        self.attn = attn
        self.device = device
        self.buckets = sorted(buckets or default_buckets(max_batch_size))
        self.max_bs = self.buckets[-1]
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.replays = 0
        self.capture_stream: torch.cuda.Stream | None = None

    def _static_batch(self, bs: int) -> ForwardBatch:
        zeros = torch.zeros(bs, dtype=torch.int64)
        ones = torch.ones(bs, dtype=torch.int64)
        return ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs], out_cache_loc=self.attn.meta.loc,
            req_rows=zeros, prefix_lens=zeros, extend_lens=ones, seq_lens=ones,
            qo_indptr=torch.arange(bs + 1, dtype=torch.int64), logits_indices=self.logits_indices[:bs],
            token_rows=self.token_rows[:bs],
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every bucket, largest first (so later graphs reuse its memory pool)."""
        dev = self.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.logits_indices = torch.arange(self.max_bs, dtype=torch.int64, device=dev)
        self.token_rows = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)  # padding: the dummy row 0
        self.attn.init_graph_capture(self.max_bs)
        # Own capture stream (never torch.cuda.graph's shared default): see the module docstring.
        self.capture_stream = torch.cuda.Stream(dev)
        self.graphs.update(capture_buckets(self.model, self.attn, self.buckets, self.attn.prepare_for_capture,
                                           self._static_batch, self.capture_stream))
        torch.cuda.synchronize(dev)
        log.info("captured decode CUDA graphs for batch sizes %s", self.buckets)

    def can_run(self, batch: ForwardBatch) -> bool:
        """True for a decode-only step of at most ``max_bs`` sequences with token inputs only."""
        return (batch.batch_size <= self.max_bs and batch.num_tokens == batch.batch_size
                and batch.input_embeds is None and batch.is_decode_only)

    def bucket(self, batch_size: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, batch_size)]

    def replay(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``batch`` through its bucket's graph. Returns views ``(logits [B, vocab] float32,
        greedy [B] int64)`` into static outputs, valid until the next replay."""
        n = batch.batch_size
        bs = self.bucket(n)
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        if batch.token_rows is not None:
            self.token_rows[:n].copy_(batch.token_rows, non_blocking=True)
        else:
            self.token_rows[:n].zero_()
        if bs > n:
            self.input_ids[n:bs].zero_()
            self.positions[n:bs].zero_()
            self.token_rows[n:bs].zero_()
        self.attn.prepare_for_replay(batch, bs)
        graph, logits, greedy = self.graphs[bs]
        graph.replay()
        self.replays += 1
        return logits[:n], greedy[:n]
