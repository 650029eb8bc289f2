"""Turns a scheduled step into a :class:`ForwardBatch`, runs the model, and returns logits."""

from __future__ import annotations

import numpy as np
import torch

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.kv import ReqToTokenTable
from engine.scheduler import ScheduledBatch


class ModelRunner:
    """Eager forward passes over the packed tokens of a step (CUDA graphs plug in here on the GPU)."""

    def __init__(self, model: torch.nn.Module, attn: AttentionBackend, table: ReqToTokenTable,
                 device: torch.device) -> None:
        self.model = model
        self.attn = attn
        self.table = table
        self.device = device
        self.graphs = None  # engine.cuda_graph.DecodeGraphs once captured; eager otherwise

    def capture_cuda_graphs(self, max_batch_size: int) -> None:
        """Capture decode graphs for batch sizes up to ``max_batch_size`` (CUDA + graph-capable backend)."""
        from engine.cuda_graph import DecodeGraphs

        self.graphs = DecodeGraphs(self.model, self.attn, self.device, max_batch_size)
        self.graphs.capture()

    def build(self, step: ScheduledBatch) -> tuple[ForwardBatch, list[bool]]:
        """Pack the step. Returns the batch and, per item, whether its last new token is sampled
        (true for decodes and for the chunk that completes a prompt).

        Everything is packed on the host (slots from each sequence's host copy of its row) and crosses to
        the device in one copy: per-item device ops cost ~10 us of host time each, and a step has up to
        64 items.
        """
        ids: list[int] = []
        pos: list[int] = []
        prefix, ext, rows, sample = [], [], [], []
        slot_chunks = []
        embed_parts: list[tuple[int, int, int, object]] = []
        for seq, n in step.items:
            start = seq.num_computed
            if n == 1:
                ids.append(seq.token_at(start))
                pos.append(start)
            else:
                ids.extend(seq.token_at(p) for p in range(start, start + n))
                pos.extend(range(start, start + n))
            prefix.append(start)
            ext.append(n)
            rows.append(seq.row)
            slot_chunks.append(seq.kv_slots[start : start + n])
            sample.append(start + n == seq.total_len)
            if "embed_fn" in seq.mm_state and start < seq.prompt_len:
                embed_parts.append((len(ids) - n, start, min(n, seq.prompt_len - start), seq))
        t, b = len(ids), len(ext)
        prefix_t = torch.tensor(prefix, dtype=torch.int64)
        ext_t = torch.tensor(ext, dtype=torch.int64)
        qo = torch.zeros(b + 1, dtype=torch.int64)
        qo[1:] = torch.cumsum(ext_t, 0)
        host = np.empty(3 * t + b, dtype=np.int64)
        host[:t] = ids
        host[t : 2 * t] = pos
        host[2 * t : 3 * t] = np.concatenate(slot_chunks)
        host[3 * t :] = qo.numpy()[1:] - 1
        # non_blocking: staged at once, never waits for a step in flight (async decode)
        dev = torch.from_numpy(host).to(self.device, non_blocking=True)
        batch = ForwardBatch(
            input_ids=dev[:t], positions=dev[t : 2 * t], out_cache_loc=dev[2 * t : 3 * t],
            req_rows=torch.tensor(rows, dtype=torch.int64), prefix_lens=prefix_t, extend_lens=ext_t,
            seq_lens=prefix_t + ext_t, qo_indptr=qo, logits_indices=dev[3 * t :],
        )
        if embed_parts:
            self._attach_embeds(batch, embed_parts)
        return batch, sample

    def _attach_embeds(self, batch: ForwardBatch, parts: list) -> None:
        """Models with non-token inputs (MOSS-TD audio) give ``mm_state["embed_fn"](start, n)`` ->
        ``(embeds [n, hidden], mask bool [n])`` for prompt positions ``start .. start+n-1``."""
        embeds, mask = None, torch.zeros(batch.num_tokens, dtype=torch.bool, device=self.device)
        for offset, start, n, seq in parts:
            e, m = seq.mm_state["embed_fn"](start, n)
            if embeds is None:
                embeds = torch.zeros(batch.num_tokens, e.shape[-1], dtype=e.dtype, device=self.device)
            embeds[offset : offset + n] = e.to(self.device)
            mask[offset : offset + n] = m.to(self.device)
        batch.input_embeds, batch.embeds_mask = embeds, mask

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits float32 ``[B, vocab]`` at each item's last new token."""
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.replay(batch)[0]
        self.attn.prepare(batch)
        return self.model(batch, self.attn)

    @torch.inference_mode()
    def forward_greedy(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits as :meth:`forward` and their greedy ids int64 ``[B]`` (a decode graph computes both)."""
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.replay(batch)
        logits = self.forward(batch)
        return logits, logits.argmax(dim=-1)
