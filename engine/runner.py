"""Turns a scheduled step into a :class:`ForwardBatch`, runs the model, and returns logits."""

from __future__ import annotations

import logging

import numpy as np
import torch

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.kv import ReqToTokenTable
from engine.scheduler import ScheduledBatch

log = logging.getLogger("diarist.engine")


class ModelRunner:
    """Eager forward passes over the packed tokens of a step (CUDA graphs plug in here on the GPU)."""

    def __init__(self, model: torch.nn.Module, attn: AttentionBackend, table: ReqToTokenTable,
                 device: torch.device) -> None:
        self.model = model
        self.attn = attn
        self.table = table
        self.device = device
        self.graphs = None  # engine.cuda_graph.DecodeGraphs once captured; eager otherwise
        self.prefill_graphs = None  # engine.prefill_graphs.PrefillGraphs once captured
        self.fallbacks: list[str] = []  # graphs that failed to capture: "what: error" (engine stats)

    def capture_graphs(self, max_batch_size: int, prefill_tokens: tuple[int, ...], prefill_max_items: int,
                       hidden: int, dtype: torch.dtype) -> None:
        """Capture decode graphs, then prefill graphs for the ``prefill_tokens`` buckets (none: no prefill
        graphs). A capture that fails leaves those steps eager, loudly: an error log line with the cause,
        and a line in :attr:`fallbacks`."""
        try:
            self.capture_cuda_graphs(max_batch_size)
        except Exception as e:  # noqa: BLE001 - any capture failure: run eagerly, never refuse to start
            self._fall_back("decode CUDA graphs", e)
            self.graphs = None
            return
        if prefill_tokens:
            try:
                self.capture_prefill_graphs(hidden, dtype, prefill_tokens, prefill_max_items)
            except Exception as e:  # noqa: BLE001
                self._fall_back("prefill CUDA graphs", e)
                self.prefill_graphs = None

    def _fall_back(self, what: str, error: BaseException) -> None:
        self.fallbacks.append(f"{what}: {type(error).__name__}: {error}")
        log.error("%s could not be set up, running eagerly instead: %s: %s", what, type(error).__name__, error)

    def capture_cuda_graphs(self, max_batch_size: int) -> None:
        """Capture decode graphs for batch sizes up to ``max_batch_size`` (CUDA + graph-capable backend)."""
        from engine.cuda_graph import DecodeGraphs

        self.graphs = DecodeGraphs(self.model, self.attn, self.device, max_batch_size)
        self.graphs.capture()

    def capture_prefill_graphs(self, hidden: int, dtype: torch.dtype, token_buckets: tuple[int, ...],
                               max_items: int) -> None:
        """Capture prefill graphs (after the decode graphs, whose capture stream they share)."""
        from engine.prefill_graphs import PrefillGraphs

        stream = self.graphs.capture_stream if self.graphs is not None else None
        self.prefill_graphs = PrefillGraphs(self.model, self.attn, self.device, hidden, dtype, token_buckets,
                                            max_items, stream)
        self.prefill_graphs.capture()

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
        decode_prefix, leading = 0, True
        for seq, n in step.items:
            start = seq.num_computed
            if leading and n == 1 and start >= seq.prompt_len:
                decode_prefix += 1
            else:
                leading = False
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
        host = np.empty(4 * t + b, dtype=np.int64)
        host[:t] = ids
        host[t : 2 * t] = pos
        host[2 * t : 3 * t] = np.concatenate(slot_chunks)
        host[3 * t : 4 * t] = np.repeat(np.asarray(rows, dtype=np.int64), ext)
        host[4 * t :] = qo.numpy()[1:] - 1
        # non_blocking: staged at once, never waits for a step in flight (async decode)
        dev = torch.from_numpy(host).to(self.device, non_blocking=True)
        batch = ForwardBatch(
            input_ids=dev[:t], positions=dev[t : 2 * t], out_cache_loc=dev[2 * t : 3 * t],
            req_rows=torch.tensor(rows, dtype=torch.int64), prefix_lens=prefix_t, extend_lens=ext_t,
            seq_lens=prefix_t + ext_t, qo_indptr=qo, logits_indices=dev[4 * t :], num_decode_prefix=decode_prefix,
            token_rows=dev[3 * t : 4 * t],
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

    def _replay(self, batch: ForwardBatch, logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """``(logits, greedy)`` from captured graphs, or ``None`` when the step has to run eagerly: a decode
        graph alone, a prefill graph alone, or the decode graph for the leading decodes followed by a
        prefill graph for the rest. With ``logits=False`` a split step skips joining the two graphs'
        logits (``[B, vocab]`` float32, 34 MB at batch 56 of MOSS-TD) and returns ``None`` for them."""
        g, pg = self.graphs, self.prefill_graphs
        if g is not None and g.can_run(batch):
            return g.replay(batch)
        if pg is None:
            return None
        k = batch.num_decode_prefix
        if k == 0:
            return pg.replay(batch) if pg.can_run(batch) else None
        if k == batch.batch_size or g is None:
            return None
        head, tail = batch.split(k)
        if not (g.can_run(head) and pg.can_run(tail)):
            return None
        dec_logits, dec_greedy = g.replay(head)
        pre_logits, pre_greedy = pg.replay(tail)  # own memory pool: the decode outputs stay intact
        return (torch.cat([dec_logits, pre_logits]) if logits else None), torch.cat([dec_greedy, pre_greedy])

    def _eager(self, batch: ForwardBatch) -> torch.Tensor:
        self.attn.prepare(batch)
        return self.model(batch, self.attn)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits float32 ``[B, vocab]`` at each item's last new token."""
        out = self._replay(batch)
        return out[0] if out is not None else self._eager(batch)

    @torch.inference_mode()
    def forward_greedy(self, batch: ForwardBatch) -> torch.Tensor:
        """Greedy next-token ids int64 ``[B]`` at each item's last new token (the graphs compute them with
        the logits, which are not returned)."""
        out = self._replay(batch, logits=False)
        return out[1] if out is not None else self._eager(batch).argmax(dim=-1)
