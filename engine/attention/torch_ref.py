"""Pure-torch attention over the token-indexed KV cache: the test oracle, runs on CPU and GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, ForwardBatch


def _expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """``[..., S, Hkv, D]`` -> ``[..., S, Hq, D]`` by repeating each KV head for its query group (GQA)."""
    group = num_q_heads // x.shape[-2]
    return x if group == 1 else x.repeat_interleave(group, dim=-2)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int,
                        sm_scale: float | None = None) -> torch.Tensor:
    """Attention of ``n`` new queries over ``S = prefix_len + n`` keys with bottom-right causal masking.

    Args:
        q: ``[n, Hq, D]``; k, v: ``[S, Hkv, D]``. Query ``j`` sits at position ``prefix_len + j`` and sees
            keys ``0 .. prefix_len + j``. Computed in float32.
    Returns:
        ``[n, Hq, D]`` in q's dtype.
    """
    n, hq, _ = q.shape
    s = k.shape[0]
    kk, vv = _expand_kv(k, hq), _expand_kv(v, hq)
    qpos = torch.arange(n, device=q.device)[:, None] + prefix_len
    mask = torch.arange(s, device=q.device)[None, :] <= qpos
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(), kk.transpose(0, 1).float(), vv.transpose(0, 1).float(),
        attn_mask=mask, scale=sm_scale,
    )
    return out.transpose(0, 1).to(q.dtype)


class TorchReferenceBackend(AttentionBackend):
    """Reference backend: gathers each sequence's K/V through ``req_to_token`` (dequantised to float32 when
    the pool is FP8) and calls SDPA.

    Decode rows (one new token) of a step are padded into one batched SDPA call; rows with several new
    tokens (prefill chunks) run one call each. Exact, simple, and slow on long contexts by design.
    """

    def prepare(self, batch: ForwardBatch) -> None:
        self.batch = batch
        ext = batch.extend_lens
        self._decode_idx = torch.nonzero(ext == 1).flatten().tolist()
        self._extend_idx = torch.nonzero(ext != 1).flatten().tolist()
        rows = batch.req_rows.to(self.table.table.device)
        if self._decode_idx:
            d = torch.tensor(self._decode_idx)
            seq = batch.seq_lens[d]
            smax = int(seq.max())
            self._dec_slots = self.table.table[rows[d.to(rows.device)], :smax].long()
            self._dec_mask = (torch.arange(smax)[None, :] < seq[:, None]).to(self._dec_slots.device)
            self._dec_tok = batch.qo_indptr[d].to(self._dec_slots.device)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                kv_stored: bool = False) -> torch.Tensor:
        b = self.batch
        if not kv_stored:
            self.kv.store(layer, b.out_cache_loc, k, v)
        out = torch.empty_like(q)
        for i in self._extend_idx:
            lo, hi = int(b.qo_indptr[i]), int(b.qo_indptr[i + 1])
            if hi == lo:
                continue
            slots = self.table.table[int(b.req_rows[i]), : int(b.seq_lens[i])].long()
            ks, vs = self.kv.read(layer, slots)  # dequantised when the pool is FP8
            out[lo:hi] = reference_attention(q[lo:hi], ks, vs, int(b.prefix_lens[i]), self.sm_scale)
        if self._decode_idx:
            hq = q.shape[1]
            qd = q[self._dec_tok]  # [Bd, Hq, D]
            kd, vd = self.kv.read(layer, self._dec_slots)  # [Bd, S, Hkv, D]
            kd, vd = _expand_kv(kd, hq), _expand_kv(vd, hq)  # [Bd, S, Hq, D]
            o = F.scaled_dot_product_attention(
                qd[:, :, None, :].float(), kd.transpose(1, 2).float(), vd.transpose(1, 2).float(),
                attn_mask=self._dec_mask[:, None, None, :], scale=self.sm_scale,
            )
            out[self._dec_tok] = o[:, :, 0, :].to(q.dtype)
        return out

    def cross_forward(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        assert self.cross is not None, "cross_forward needs a CrossKVPool"
        b = self.batch
        kbuf, vbuf = self.cross.k[layer], self.cross.v[layer]
        out = torch.empty_like(q)
        for i in self._extend_idx:
            lo, hi = int(b.qo_indptr[i]), int(b.qo_indptr[i + 1])
            row = int(b.req_rows[i])
            o = F.scaled_dot_product_attention(
                q[lo:hi].transpose(0, 1).float(), kbuf[row].transpose(0, 1).float(),
                vbuf[row].transpose(0, 1).float(), scale=self.sm_scale)
            out[lo:hi] = o.transpose(0, 1).to(q.dtype)
        if self._decode_idx:
            rows = b.req_rows[torch.tensor(self._decode_idx)].to(kbuf.device)
            qd = q[self._dec_tok][:, :, None, :]
            o = F.scaled_dot_product_attention(
                qd.float(), kbuf[rows].transpose(1, 2).float(), vbuf[rows].transpose(1, 2).float(),
                scale=self.sm_scale)
            out[self._dec_tok] = o[:, :, 0, :].to(q.dtype)
        return out
