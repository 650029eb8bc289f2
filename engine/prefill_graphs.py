"""Prefill CUDA graphs by token-count bucket: the prompt chunks of a step replayed as one graph.

Why: an eager forward of the decoder is bound by the host (28 layers of Triton and cuBLAS launches from
Python take longer than the GPU needs for the prompt tokens a W-short step admits); with 16-64 short
requests in flight a prefill step comes every few decode steps, and those eager steps took a fifth of
W-short's wall time (``benchmarks/results/archive/diag_wshort_h200_f8e3287.json``). A step that mixes decodes with prompt
chunks now replays two graphs back to back on the same stream: the decode graph for its leading decode
items (:mod:`engine.cuda_graph`) and a prefill graph for the rest.

A prefill graph of bucket ``N`` takes up to ``N`` new tokens in up to ``max_items`` items (any mix of first
chunks and continuations, with audio embeddings). Padding: tokens ``T..N-1`` are token 0 at position 0 and
write their K/V to the dummy slot 0; items ``n..max_items-1`` have no new tokens, so their attention
programs exit at once (the extend kernel's grid is fixed at ``max_items x kv_heads x N/64``); logits rows
of padded items are computed and ignored. The graphs share one private memory pool (they never run at once)
that is not the decode graphs' pool: a mixed step reads the decode graph's outputs after the prefill graph
ran. They are captured on the decode graphs' capture stream (the same stream replays both; the encoder's
graphs, which run concurrently, have their own: see :mod:`engine.cuda_graph`).
"""

from __future__ import annotations

import bisect
import logging

import torch

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.cuda_graph import capture_buckets

log = logging.getLogger("diarist.engine")

DEFAULT_TOKEN_BUCKETS = (64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096)


class PrefillGraphs:
    """Captured prefill graphs for one model and attention backend.

    Static inputs: ``input_ids``/``positions``/``token_rows`` int64 ``[max_tokens]``, ``embeds`` ``[max_tokens, hidden]``
    (model dtype) with ``embeds_mask`` bool ``[max_tokens]``, ``logits_indices`` int64 ``[max_items]``, and the
    backend's item metadata and slots (:meth:`GraphCapableBackend.init_prefill_capture`). Outputs per bucket:
    float32 logits ``[max_items, vocab]`` and int64 greedy ids ``[max_items]``.

    Args:
        hidden: the model's embedding width (for the static ``embeds``).
        dtype: the model's dtype.
        token_buckets: token counts to capture (each at most the engine's chunk size plus decodes is
            useful; larger steps run eagerly).
        max_items: most items (sequences) a replayed step may carry.
        stream: capture stream (the decode graphs'); ``None`` makes one.

    Raises (``capture``): RuntimeError from CUDA or the backend when a graph cannot be captured.
    """

    def __init__(self, model: torch.nn.Module, attn: AttentionBackend, device: torch.device, hidden: int,
                 dtype: torch.dtype, token_buckets: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS,
                 max_items: int = 32, stream: torch.cuda.Stream | None = None) -> None:
        self.model = model
        self.attn = attn
        self.device = device
        self.hidden = hidden
        self.dtype = dtype
        self.buckets = sorted({int(b) for b in token_buckets if int(b) > 0})
        self.max_tokens = self.buckets[-1]
        self.max_items = max_items
        self.stream = stream
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.replays = 0

    def _static_batch(self, tokens: int) -> ForwardBatch:
        p = self.max_items
        zeros = torch.zeros(p, dtype=torch.int64)
        return ForwardBatch(
            input_ids=self.input_ids[:tokens], positions=self.positions[:tokens], out_cache_loc=self.attn.meta.loc,
            req_rows=zeros, prefix_lens=zeros, extend_lens=zeros, seq_lens=zeros,
            qo_indptr=torch.zeros(p + 1, dtype=torch.int64), logits_indices=self.logits_indices,
            input_embeds=self.embeds[:tokens], embeds_mask=self.embeds_mask[:tokens],
            token_rows=self.token_rows[:tokens],
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every bucket, largest first (later graphs reuse its memory)."""
        dev, n = self.device, self.max_tokens
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.token_rows = torch.zeros(n, dtype=torch.int64, device=dev)  # padding: the dummy row 0
        self.embeds = torch.zeros(n, self.hidden, dtype=self.dtype, device=dev)
        self.embeds_mask = torch.zeros(n, dtype=torch.bool, device=dev)
        self.logits_indices = torch.zeros(self.max_items, dtype=torch.int64, device=dev)
        self.attn.init_prefill_capture(n, self.max_items)
        if self.stream is None:
            self.stream = torch.cuda.Stream(dev)
        self.graphs.update(capture_buckets(self.model, self.attn, self.buckets, self.attn.prepare_prefill_capture,
                                           self._static_batch, self.stream))
        torch.cuda.synchronize(dev)
        log.info("captured prefill CUDA graphs for token counts %s (up to %d items)", self.buckets,
                 self.max_items)

    def can_run(self, batch: ForwardBatch) -> bool:
        """True when ``batch`` fits a bucket: at most ``max_tokens`` tokens and ``max_items`` items."""
        return 0 < batch.num_tokens <= self.max_tokens and batch.batch_size <= self.max_items

    def replay(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``batch`` through the smallest bucket that holds its tokens. Returns views
        ``(logits [B, vocab] float32, greedy [B] int64)`` into static outputs, valid until the next replay."""
        t, n = batch.num_tokens, batch.batch_size
        tokens = self.buckets[bisect.bisect_left(self.buckets, t)]
        self.input_ids[:t].copy_(batch.input_ids, non_blocking=True)
        self.positions[:t].copy_(batch.positions, non_blocking=True)
        self.input_ids[t:tokens].zero_()
        self.positions[t:tokens].zero_()
        if batch.token_rows is not None:
            self.token_rows[:t].copy_(batch.token_rows, non_blocking=True)
        else:
            self.token_rows[:t].zero_()
        self.token_rows[t:tokens].zero_()
        if batch.input_embeds is not None and batch.embeds_mask is not None:
            self.embeds[:t].copy_(batch.input_embeds, non_blocking=True)
            self.embeds_mask[:t].copy_(batch.embeds_mask, non_blocking=True)
            self.embeds_mask[t:tokens].zero_()
        else:
            self.embeds_mask[:tokens].zero_()
        self.logits_indices[:n].copy_(batch.logits_indices, non_blocking=True)
        self.logits_indices[n:].zero_()
        self.attn.prepare_prefill_replay(batch, tokens)
        graph, logits, greedy = self.graphs[tokens]
        graph.replay()
        self.replays += 1
        return logits[:n], greedy[:n]
