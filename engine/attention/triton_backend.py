"""Triton attention backend (CUDA): split-KV decode, unified extend, cross-attention; CUDA-graph hooks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.attention.triton_ops import (
    decode_attention,
    decode_splits_for_fill,
    decode_tile,
    extend_attention,
    extend_tile,
)
from engine.config import EngineConfig
from engine.kv import CrossKVPool, KVDestination, KVPool, ReqToTokenTable


@dataclass
class _StepMeta:
    """Device metadata of one step. Decode rows are the items with one new token; the rest are extends."""

    loc: torch.Tensor  # int64 [T] KV slot of each new token
    n_dec: int
    all_dec: bool  # every item is a decode, so token b is item b and no gather is needed
    dec_tok: torch.Tensor | None  # int64 [n_dec] packed token index of each decode row
    dec_rows: torch.Tensor  # int32 [n_dec]
    dec_lens: torch.Tensor  # int32 [n_dec] keys per decode row (= its seq_len)
    fill: int  # splits per decode row at most
    n_ext: int
    ext_rows: torch.Tensor  # int32 [n_ext]
    ext_kv_lens: torch.Tensor  # int32 [n_ext]
    ext_lens: torch.Tensor  # int32 [n_ext]
    ext_qo: torch.Tensor  # int32 [n_ext] packed offset of the item's first new token
    max_ext: int
    static: bool = False  # graph mode: use the split scratch that captured graphs point at


class TritonBackend(AttentionBackend):
    """GPU backend over the token-indexed KV pool; same results as :class:`TorchReferenceBackend`.

    Decode rows go through :func:`decode_attention` (split-KV, GQA, split count from the device-side
    lengths), other items through :func:`extend_attention` (bottom-right causal over prefix and chunk).
    Whisper cross-attention reuses both kernels with direct addressing into the ``CrossKVPool`` rows.

    For decode CUDA graphs, :meth:`init_graph_capture` allocates static ``rows``/``seq_lens``/``loc``
    buffers and split scratch for ``max_batch_size``; padded rows use row 0, length 1 and slot 0.

    Args:
        max_splits: power of two, most KV splits per decode row. min_split_tokens: a row is split into
            pieces of at least this many keys. num_sms: streaming multiprocessors (read from the device).
        large_tile_min_extend: see :func:`extend_tile`. single_split_per_sm: see
            :func:`decode_splits_for_fill`. Both per backend (so per engine), from ``EngineConfig``.
    """

    def __init__(self, kv: KVPool, table: ReqToTokenTable, cross: CrossKVPool | None = None,
                 sm_scale: float | None = None, max_splits: int = 64, min_split_tokens: int = 256,
                 num_sms: int | None = None, large_tile_min_extend: int = EngineConfig.extend_large_tile_min_tokens,
                 single_split_per_sm: int = EngineConfig.decode_single_split_programs_per_sm) -> None:
        super().__init__(kv, table, cross, sm_scale)
        self.device = table.table.device
        self.max_splits = max_splits
        self.min_split_tokens = min_split_tokens
        self.large_tile_min_extend = large_tile_min_extend
        self.single_split_per_sm = single_split_per_sm
        if num_sms is None:
            num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                       if self.device.type == "cuda" else 132)
        self.num_sms = num_sms
        self.scale = sm_scale if sm_scale is not None else kv.head_dim ** -0.5
        n_src = table.max_reqs + 1
        self._src_lens = (torch.full((n_src,), cross.source_len, dtype=torch.int32, device=self.device)
                          if cross is not None else None)
        self._part: tuple[torch.Tensor, torch.Tensor] | None = None  # eager split scratch (may grow)
        self._gpart: tuple[torch.Tensor, torch.Tensor] | None = None  # graph split scratch (never freed)
        self._static: dict[str, torch.Tensor] | None = None
        self._pstatic: dict[str, torch.Tensor] | None = None
        self.meta: _StepMeta | None = None

    @classmethod
    def config_options(cls, config: EngineConfig) -> dict[str, int]:
        """The split-KV and tile thresholds of ``config`` (per engine, see the class docstring)."""
        return {"large_tile_min_extend": config.extend_large_tile_min_tokens,
                "single_split_per_sm": config.decode_single_split_programs_per_sm}

    # -- per step ------------------------------------------------------------------------------------
    def _scratch(self, rows: int, hq: int, dim: int, static: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 split partials ``[rows, hq, max_splits, dim]`` and LSEs ``[rows, hq, max_splits]``."""
        part = self._gpart if static else self._part
        if part is None or part[0].shape[0] < rows or part[0].shape[1] < hq:
            capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
            if static and (part is not None or capturing):
                raise RuntimeError("graph split scratch must be sized by the warm-up before capture")
            if static:
                rows = self._static["meta"].shape[1]
            part = (
                torch.empty((rows, hq, self.max_splits, dim), dtype=torch.float32, device=self.device),
                torch.empty((rows, hq, self.max_splits), dtype=torch.float32, device=self.device),
            )
            if static:
                self._gpart = part
            else:
                self._part = part
        return part

    def prepare(self, batch: ForwardBatch) -> None:
        ext = batch.extend_lens
        dec = ext == 1
        dec_idx = torch.nonzero(dec).flatten()
        ext_idx = torch.nonzero(~dec).flatten()
        n_dec, n_ext = int(dec_idx.numel()), int(ext_idx.numel())
        rows, seq = batch.req_rows, batch.seq_lens
        host = torch.cat([rows[dec_idx], seq[dec_idx], rows[ext_idx], seq[ext_idx], ext[ext_idx],
                          batch.qo_indptr[:-1][ext_idx]]).to(torch.int32)
        dev = host.to(self.device, non_blocking=True)
        d_rows, d_lens, e_rows, e_kv, e_len, e_qo = torch.split(dev, [n_dec, n_dec] + [n_ext] * 4)
        all_dec = n_ext == 0
        dec_tok = None if all_dec else batch.qo_indptr[:-1][dec_idx].to(self.device, non_blocking=True)
        hkv = self.kv.num_kv_heads
        self.meta = _StepMeta(
            loc=batch.out_cache_loc, n_dec=n_dec, all_dec=all_dec, dec_tok=dec_tok, dec_rows=d_rows,
            dec_lens=d_lens, fill=decode_splits_for_fill(n_dec, hkv, self.max_splits, self.num_sms,
                                                              single_split_per_sm=self.single_split_per_sm),
            n_ext=n_ext, ext_rows=e_rows, ext_kv_lens=e_kv, ext_lens=e_len, ext_qo=e_qo,
            max_ext=int(ext[ext_idx].max()) if n_ext else 0,
        )

    def _decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                lens: torch.Tensor, table: torch.Tensor | None, src_len: int,
                scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)) -> None:
        m = self.meta
        qd = q if m.all_dec else q[m.dec_tok]
        od = out if m.all_dec else torch.empty_like(qd)
        po, pl = self._scratch(m.n_dec, q.shape[1], q.shape[2], m.static)
        tile = decode_tile(scales[0] is not None)
        decode_attention(qd, k, v, m.dec_rows, lens, od, sm_scale=self.scale, table=table, src_len=src_len,
                         fill_splits=m.fill, max_splits=self.max_splits,
                         min_split_tokens=self.min_split_tokens, part_o=po, part_lse=pl,
                         k_scale=scales[0], v_scale=scales[1], block_n=tile.block_n, num_warps=tile.num_warps,
                         num_stages=tile.num_stages)
        if not m.all_dec:
            out[m.dec_tok] = od

    def kv_destination(self, layer: int) -> KVDestination:
        return self.kv.destination(layer, self.meta.loc)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                kv_stored: bool = False) -> torch.Tensor:
        m = self.meta
        if not kv_stored:
            self.kv.store(layer, m.loc, k, v)
        q = q if q.stride(-1) == 1 else q.contiguous()
        out = torch.empty_like(q)
        kb, vb = self.kv.k[layer], self.kv.v[layer]
        scales = (self.kv.k_scale[layer], self.kv.v_scale[layer]) if self.kv.quantized else (None, None)
        if m.n_dec:
            self._decode(q, kb, vb, out, m.dec_lens, self.table.table, 0, scales)
        if m.n_ext:
            block_m, warps = extend_tile(m.max_ext, self.large_tile_min_extend, q.element_size())
            extend_attention(q, kb, vb, out, m.ext_rows, m.ext_kv_lens, m.ext_lens, m.ext_qo, m.max_ext,
                             sm_scale=self.scale, table=self.table.table, causal=True, block_m=block_m,
                             num_warps=warps, k_scale=scales[0], v_scale=scales[1])
        return out

    def cross_forward(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if self.cross is None:
            raise RuntimeError("cross_forward needs a CrossKVPool")
        m = self.meta
        src = self.cross.source_len
        kb = self.cross.k[layer].view(-1, *self.cross.k[layer].shape[2:])
        vb = self.cross.v[layer].view(-1, *self.cross.v[layer].shape[2:])
        q = q if q.stride(-1) == 1 else q.contiguous()
        out = torch.empty_like(q)
        if m.n_dec:
            self._decode(q, kb, vb, out, self._src_lens[: m.n_dec], None, src)
        if m.n_ext:
            extend_attention(q, kb, vb, out, m.ext_rows, self._src_lens[: m.n_ext], m.ext_lens, m.ext_qo,
                             m.max_ext, sm_scale=self.scale, table=None, src_len=src, causal=False)
        return out

    # -- CUDA graphs: prefill (extend items only; engine.prefill_graphs) ---------------------------
    def init_prefill_capture(self, max_tokens: int, max_items: int) -> None:
        """Static metadata for prefill graphs: int64 ``[4, max_items]`` (rows, KV lengths, new-token counts,
        packed offsets) and the KV slots int64 ``[max_tokens]``. Padded items have no new tokens, so every
        program of theirs exits at once; padded tokens write their K/V to the dummy slot 0."""
        self._pstatic = {
            "ext": torch.zeros((4, max_items), dtype=torch.int64, device=self.device),
            "loc": torch.zeros(max_tokens, dtype=torch.int64, device=self.device),
        }

    def prepare_prefill_capture(self, tokens: int) -> None:
        s = self._pstatic
        s["ext"].zero_()
        s["loc"].zero_()
        empty = s["ext"][0, :0]
        ext = s["ext"]
        self.meta = _StepMeta(
            loc=s["loc"][:tokens], n_dec=0, all_dec=False, dec_tok=None, dec_rows=empty, dec_lens=empty,
            fill=1, n_ext=ext.shape[1], ext_rows=ext[0], ext_kv_lens=ext[1], ext_lens=ext[2], ext_qo=ext[3],
            max_ext=tokens, static=True,
        )

    def prepare_prefill_replay(self, batch: ForwardBatch, tokens: int) -> None:
        s = self._pstatic
        n, t = batch.batch_size, batch.num_tokens
        host = torch.zeros(s["ext"].shape, dtype=torch.int64)
        host[0, :n] = batch.req_rows
        host[1, :n] = batch.seq_lens
        host[2, :n] = batch.extend_lens
        host[3, :n] = batch.qo_indptr[:-1]
        s["ext"].copy_(host, non_blocking=True)
        s["loc"][:t].copy_(batch.out_cache_loc, non_blocking=True)
        s["loc"][t:tokens].zero_()

    # -- CUDA graphs (decode only) -------------------------------------------------------------------
    def init_graph_capture(self, max_batch_size: int) -> None:
        """Static buffers for graphs up to ``max_batch_size``; the split scratch is sized by the first
        (eager) warm-up forward, which must run at the largest bucket before any capture."""
        self._gpart = None
        self._static = {
            "meta": torch.zeros((2, max_batch_size), dtype=torch.int32, device=self.device),
            "loc": torch.zeros(max_batch_size, dtype=torch.int64, device=self.device),
        }

    def prepare_for_capture(self, batch_size: int) -> None:
        s = self._static
        if s is None:
            raise RuntimeError("call init_graph_capture first")
        s["meta"][0].zero_()
        s["meta"][1].fill_(1)
        s["loc"].zero_()
        empty = s["meta"][0, :0]
        self.meta = _StepMeta(
            loc=s["loc"][:batch_size], n_dec=batch_size, all_dec=True, dec_tok=None,
            dec_rows=s["meta"][0, :batch_size], dec_lens=s["meta"][1, :batch_size],
            fill=decode_splits_for_fill(batch_size, self.kv.num_kv_heads, self.max_splits, self.num_sms,
                                        single_split_per_sm=self.single_split_per_sm),
            n_ext=0, ext_rows=empty, ext_kv_lens=empty, ext_lens=empty, ext_qo=empty, max_ext=0, static=True,
        )

    def prepare_for_replay(self, batch: ForwardBatch, padded_batch_size: int) -> None:
        s = self._static
        n = batch.batch_size
        host = torch.ones((2, padded_batch_size), dtype=torch.int32)
        host[0] = 0
        host[0, :n] = batch.req_rows
        host[1, :n] = batch.seq_lens
        s["meta"][:, :padded_batch_size].copy_(host, non_blocking=True)
        s["loc"][:n].copy_(batch.out_cache_loc, non_blocking=True)
        s["loc"][n:padded_batch_size].zero_()
