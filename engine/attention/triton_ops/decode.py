"""Split-KV decode attention (one query token per sequence) over the token-indexed KV cache.

Stage 1, grid ``(B, num_kv_heads, max_splits)``: program ``(b, g, s)`` takes the ``s``-th slice of sequence
``b``'s keys, attends with all query heads of KV group ``g`` at once (GQA: the group's heads are the rows
of one ``tl.dot``), and writes a normalised partial output and its log-sum-exp. Stage 2, grid
``(B, num_q_heads)``, merges the partials by their log-sum-exp (the flash-decoding merge: Dao et al.,
"Flash-Decoding for long-context inference", 2023).

The grid depends only on the batch size, and the number of splits a sequence actually uses is computed
inside the kernels from its device-side length (``min(fill_splits, cdiv(len, min_split_tokens))``), so a
captured CUDA graph stays valid while lengths change. Splits past a sequence's end exit at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.config import EngineConfig

_LOG2E = 1.4426950408889634


@triton.jit
def _split_range(seq_len, sid, fill_splits, MIN_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
    n_splits = tl.minimum(tl.maximum(tl.cdiv(seq_len, MIN_SPLIT), 1), fill_splits)
    split_len = tl.cdiv(tl.cdiv(seq_len, n_splits), BLOCK_N) * BLOCK_N
    start = sid * split_len
    end = tl.minimum(start + split_len, seq_len)
    return start, end


@triton.jit
def _decode_stage1(
    Q, K, V, KScale, VScale, Table, Rows, SeqLens, PartO, PartLse, O,
    qk_scale, fill_splits,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ss, stride_tr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ot, stride_oh,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr, MIN_SPLIT: tl.constexpr, USE_TABLE: tl.constexpr, DOT_PREC: tl.constexpr,
    DIRECT: tl.constexpr, KV_FP8: tl.constexpr, WIDE: tl.constexpr,
):
    b = tl.program_id(0)
    g = tl.program_id(1)
    sid = tl.program_id(2)
    seq_len = tl.load(SeqLens + b)
    start, end = _split_range(seq_len, sid, fill_splits, MIN_SPLIT, BLOCK_N)
    if start < end:
        row = tl.load(Rows + b).to(tl.int64)
        offs_h = tl.arange(0, BLOCK_H)
        hmask = offs_h < GROUP
        heads = g * GROUP + offs_h
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < HEAD_DIM
        q = tl.load(Q + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=hmask[:, None] & dmask[None, :], other=0.0)
        if KV_FP8:  # the products run in WIDE (see decode_attention)
            q = q.to(WIDE)
        m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            nmask = pos < end
            if USE_TABLE:
                slot = tl.load(Table + row * stride_tr + pos, mask=nmask, other=0).to(tl.int64)
            else:
                slot = row * stride_tr + pos
            kv_mask = nmask[:, None] & dmask[None, :]
            k = tl.load(K + slot[:, None] * stride_ks + g * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
            if KV_FP8:  # codes widened exactly; a key's scale multiplies its score
                ks = tl.load(KScale + slot * stride_ss + g, mask=nmask, other=0.0)
                s = tl.dot(q, tl.trans(k.to(WIDE)), input_precision=DOT_PREC) * (qk_scale * ks[None, :])
            else:
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
            s = tl.where(nmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + slot[:, None] * stride_vs + g * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
            if KV_FP8:  # a value's scale multiplies its softmax weight (l_i keeps the unscaled weights)
                vsc = tl.load(VScale + slot * stride_ss + g, mask=nmask, other=0.0)
                pv = tl.dot((p * vsc[None, :]).to(WIDE), v.to(WIDE), input_precision=DOT_PREC)
            else:
                pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        out = acc / l_i[:, None]
        if DIRECT:  # one split: this is the whole softmax, so it is the output (stage 2 would copy it)
            po = O + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
            tl.store(po, out.to(O.dtype.element_ty), mask=hmask[:, None] & dmask[None, :])
        else:
            po = PartO + b * stride_pb + heads[:, None] * stride_ph + sid * stride_ps + offs_d[None, :]
            tl.store(po, out, mask=hmask[:, None] & dmask[None, :])
            tl.store(PartLse + b * stride_lb + heads * stride_lh + sid, m_i + tl.log2(l_i), mask=hmask)


@triton.jit
def _decode_stage2(
    PartO, PartLse, SeqLens, O, fill_splits,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ot, stride_oh,
    MAX_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    MIN_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(SeqLens + b)
    sids = tl.arange(0, MAX_SPLITS)
    start, end = _split_range(seq_len, sids, fill_splits, MIN_SPLIT, BLOCK_N)
    valid = start < end
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    lse = tl.load(PartLse + b * stride_lb + h * stride_lh + sids, mask=valid, other=float("-inf"))
    w = tl.where(valid, tl.exp2(lse - tl.max(lse, 0)), 0.0)
    part = tl.load(PartO + b * stride_pb + h * stride_ph + sids[:, None] * stride_ps + offs_d[None, :],
                   mask=valid[:, None] & dmask[None, :], other=0.0)
    out = tl.sum(w[:, None] * part, 0) / tl.sum(w, 0)
    tl.store(O + b * stride_ot + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=dmask)


# Batches with at least this many (sequence, KV head) programs per SM run one split per sequence: stage 1
# then writes the output and stage 2 is not launched. Faster for W-short c64 (batch ~56, ~300 keys) on an
# H200 (benchmarks/results/archive/engine_h200_e14049f_split_variants.json). 0: off. The engine's value is
# EngineConfig.decode_single_split_programs_per_sm.
def decode_splits_for_fill(batch_size: int, num_kv_heads: int, max_splits: int, num_sms: int = 132,
                           per_sm: int = 4,
                           single_split_per_sm: int = EngineConfig.decode_single_split_programs_per_sm) -> int:
    """Most splits per sequence worth launching: enough programs for about ``per_sm`` per SM (132 on an
    H200), capped at ``max_splits``; 1 once the batch alone gives ``single_split_per_sm`` programs
    per SM. Depends only on the (padded) batch size, so it is fixed per graph bucket. Four per SM,
    measured on an H200 (bf16, 8 KV heads, benchmarks/bench_decode_ops.py): batch 1 at 35K keys takes
    42 us per layer with 64 splits against 51 us with 32 (3.4 vs 2.8 TB/s)."""
    programs = max(1, batch_size * num_kv_heads)
    if single_split_per_sm and programs >= single_split_per_sm * num_sms:
        return 1
    want = -(-per_sm * num_sms // programs)
    return max(1, min(max_splits, want))


@dataclass(frozen=True)
class DecodeTile:
    """Stage-1 launch shape of :func:`decode_attention`: keys per iteration, warps, pipeline stages."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


# Fastest of the tiles swept on an H200 at batch 1 and 16, 35K keys, 28-layer graphs in the engine's slot
# layout (benchmarks/diag_decode_tiles.py, results/diag_decode_tiles_h200.json): bf16 64 keys / 4 warps /
# 2 stages; FP8 128 keys / 4 warps / 3 stages (64 keys lose 20% at batch 1 and 45% at batch 16).
_TILES = {False: DecodeTile(), True: DecodeTile(block_n=128, num_warps=4, num_stages=3)}


def decode_tile(kv_fp8: bool) -> DecodeTile:
    """The engine's stage-1 tile for a bf16/fp16 (``kv_fp8=False``) or FP8 e4m3 KV cache."""
    return _TILES[kv_fp8]


def decode_attention(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
    out: torch.Tensor, *, sm_scale: float, table: torch.Tensor | None = None, src_len: int = 0,
    fill_splits: int = 8, max_splits: int = 32, min_split_tokens: int = 256,
    part_o: torch.Tensor | None = None, part_lse: torch.Tensor | None = None, block_n: int = 64,
    num_warps: int = 4, num_stages: int = 2, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query per sequence over that sequence's first ``seq_lens[b]`` keys (no mask).

    Args:
        q: ``[B, Hq, D]`` (last dim contiguous). k_buf, v_buf: ``[num_slots, Hkv, D]`` with ``Hq % Hkv == 0``.
        rows: int32/int64 ``[B]`` on the device: ``req_to_token`` rows, or source rows when ``table`` is None.
        seq_lens: int32 ``[B]`` on the device, each >= 1 (keys of sequence ``b``: positions ``0..len-1``).
        out: ``[B, Hq, D]``, written in place and returned.
        table: int32 ``[R, max_ctx]`` ``req_to_token``; ``None`` means key ``pos`` of ``row`` is slot
            ``row * src_len + pos`` (cross-attention KV stored as ``[R, src_len, H, D]``).
        fill_splits: splits per sequence at most (see :func:`decode_splits_for_fill`), <= ``max_splits``.
        max_splits: power of two; sizes the partial buffers and the stage-2 reduction.
        part_o, part_lse: float32 scratch ``[>=B, Hq, max_splits, D]`` and ``[>=B, Hq, max_splits]``
            (static for CUDA graphs); allocated when omitted.
        block_n, num_warps, num_stages: stage-1 tile (keys per iteration) and launch shape.
        k_scale, v_scale: float32 ``[num_slots, Hkv]`` when k_buf/v_buf hold FP8 e4m3 codes
            (:mod:`engine.kv.fp8`: per token-head scales); dequantised in registers.
            The products then run in float16 when q is bf16 or fp16: e4m3 widens to float16 in one
            instruction per pair and every code is exact in it, as is a bf16 q (|q| < 65504), and it is
            faster than widening to bf16 (results/diag_decode_tiles_h200.json); p times a value's scale is
            rounded to float16 (10 mantissa bits, bf16 has 7). A float32 q keeps float32.
    Raises:
        ValueError: inconsistent head counts or ``fill_splits > max_splits``.
    """
    bsz, hq, dim = q.shape
    hkv = k_buf.shape[1]
    if hq % hkv or fill_splits > max_splits or max_splits & (max_splits - 1):
        raise ValueError(f"bad decode shapes: Hq={hq} Hkv={hkv} fill={fill_splits} max={max_splits}")
    if bsz == 0:
        return out
    if part_o is None:
        part_o = torch.empty((bsz, hq, max_splits, dim), dtype=torch.float32, device=q.device)
    if part_lse is None:
        part_lse = torch.empty((bsz, hq, max_splits), dtype=torch.float32, device=q.device)
    group = hq // hkv
    block_d = triton.next_power_of_2(dim)
    use_table = table is not None
    tbl = table if use_table else rows
    stride_tr = table.stride(0) if use_table else src_len
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    direct = fill_splits == 1
    fp8 = k_scale is not None
    ks, vs = (k_scale, v_scale) if fp8 else (q, q)  # unused without FP8
    _decode_stage1[(bsz, hkv, fill_splits)](
        q, k_buf, v_buf, ks, vs, tbl, rows, seq_lens, part_o, part_lse, out,
        sm_scale * _LOG2E, fill_splits,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        ks.stride(0), stride_tr,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        HEAD_DIM=dim, MIN_SPLIT=min_split_tokens, USE_TABLE=use_table, DOT_PREC=prec, DIRECT=direct,
        KV_FP8=fp8, WIDE=tl.float32 if q.dtype == torch.float32 else tl.float16, num_warps=num_warps,
        num_stages=num_stages,
    )
    if direct:
        return out
    _decode_stage2[(bsz, hq)](
        part_o, part_lse, seq_lens, out, fill_splits,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        MAX_SPLITS=max_splits, BLOCK_D=block_d, HEAD_DIM=dim, MIN_SPLIT=min_split_tokens, BLOCK_N=block_n,
        num_warps=4,
    )
    return out
