"""Extend (prefill-chunk) attention: several new queries per sequence over its whole KV, in one pass.

The engine stores a step's new K/V in the pool before attending, so one stage covers the cached prefix and
the new tokens alike: every key is read through the ``req_to_token`` row (a "unified" extend kernel).
Grid ``(num_items, num_kv_heads, cdiv(max_extend, BLOCK_M))``; program ``(i, g, m)`` owns ``BLOCK_M``
queries of item ``i`` for all query heads of KV head ``g`` (so each K/V tile is loaded once per group)
and runs an online softmax (Dao et al., FlashAttention, 2022) over the keys they may see: first the
blocks every row sees (no mask), then the diagonal blocks (masked). With ``causal`` the mask is bottom-right: query ``j`` of an item with ``kv_len`` keys and ``n`` new
tokens sits at position ``kv_len - n + j`` and sees keys ``0 .. kv_len - n + j``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.config import EngineConfig

_LOG2E = 1.4426950408889634

# Steps whose longest item brings at least ``large_tile_min_extend`` new tokens (EngineConfig
# .extend_large_tile_min_tokens, 2,048 by default) take 128 queries per program (8 warps): faster over long
# keys on an H200 (benchmarks/diag_extend.py, results/diag_extend_h200.json; in the engine,
# engine_h200.md "fifth session"); below it (short prompts, decodes in a mixed step) 64 keeps more
# programs for the few keys. Float32 stays at 64: its 128-query tile (Q, K, V and the accumulator at 4
# bytes) exceeds the shared memory of a Hopper SM (Triton OutOfResources). Prefill graphs take the tile
# of their bucket's token count when they are captured.
def extend_tile(max_extend: int, large_tile_min_extend: int = EngineConfig.extend_large_tile_min_tokens,
                element_size: int = 2) -> tuple[int, int | None]:
    """``(block_m, num_warps)`` for a causal extend step whose longest item has ``max_extend`` new tokens,
    for q/k/v of ``element_size`` bytes (``num_warps=None``: chosen from the tile size); 128 queries from
    ``large_tile_min_extend`` tokens on (0: never) in 16-bit dtypes, else 64."""
    if large_tile_min_extend and max_extend >= large_tile_min_extend and element_size <= 2:
        return 128, 8
    return 64, None


@triton.jit
def _attend(q, acc, m_i, l_i, K, V, KScale, VScale, Table, row, n0, qpos, kv_end, qk_scale, g,
            stride_ks, stride_kh, stride_vs, stride_vh, stride_ss, stride_tr, offs_d, dmask,
            BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_TABLE: tl.constexpr,
            DOT_PREC: tl.constexpr, KV_FP8: tl.constexpr):
    """One online-softmax update of ``(acc, m_i, l_i)`` with keys ``n0 .. n0+BLOCK_N-1``; without
    ``MASKED`` every one of them is known to be visible to every row."""
    pos = n0 + tl.arange(0, BLOCK_N)
    nmask = pos < kv_end
    if USE_TABLE:
        if MASKED:
            slot = tl.load(Table + row * stride_tr + pos, mask=nmask, other=0).to(tl.int64)
        else:
            slot = tl.load(Table + row * stride_tr + pos).to(tl.int64)
    else:
        slot = row * stride_tr + pos
    kv_mask = nmask[:, None] & dmask[None, :]
    k = tl.load(K + slot[:, None] * stride_ks + g * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
    if KV_FP8:  # as in decode: codes widened exactly, the key's scale on its score
        ks = tl.load(KScale + slot * stride_ss + g, mask=nmask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PREC) * (qk_scale * ks[None, :])
    else:
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
    if MASKED:
        keep = nmask[None, :]
        if CAUSAL:
            keep = keep & (pos[None, :] <= qpos[:, None])
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + slot[:, None] * stride_vs + g * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
    if KV_FP8:  # the value's scale on its softmax weight
        vsc = tl.load(VScale + slot * stride_ss + g, mask=nmask, other=0.0)
        pv = tl.dot((p * vsc[None, :]).to(q.dtype), v.to(q.dtype), input_precision=DOT_PREC)
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _extend_kernel(
    Q, K, V, KScale, VScale, O, Table, Rows, KvLens, ExtLens, QoStart,
    qk_scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ss, stride_ot, stride_oh, stride_tr,
    GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TABLE: tl.constexpr,
    DOT_PREC: tl.constexpr, KV_FP8: tl.constexpr,
):
    i = tl.program_id(0)
    g = tl.program_id(1)
    mb = tl.program_id(2)
    ext = tl.load(ExtLens + i)
    if mb * BLOCK_M < ext:
        kv_len = tl.load(KvLens + i)
        row = tl.load(Rows + i).to(tl.int64)
        q0 = tl.load(QoStart + i).to(tl.int64)
        # Rows of the tile: BLOCK_M queries x the GROUP query heads that share KV head g (GQA).
        r = tl.arange(0, BLOCK_M * GROUP_P2)
        qi = mb * BLOCK_M + r // GROUP_P2
        hh = r % GROUP_P2
        rmask = (qi < ext) & (hh < GROUP)
        head = g * GROUP + hh
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < HEAD_DIM
        q = tl.load(Q + (q0 + qi)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        qpos = kv_len - ext + qi
        if CAUSAL:
            kv_end = tl.minimum(kv_len - ext + (mb + 1) * BLOCK_M, kv_len)
            visible = kv_len - ext + mb * BLOCK_M + 1  # keys every row of the tile sees
        else:
            kv_end = kv_len
            visible = kv_len
        full_end = (visible // BLOCK_N) * BLOCK_N
        m_i = tl.full([BLOCK_M * GROUP_P2], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M * GROUP_P2], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M * GROUP_P2, BLOCK_D], dtype=tl.float32)
        for n0 in range(0, full_end, BLOCK_N):
            acc, m_i, l_i = _attend(q, acc, m_i, l_i, K, V, KScale, VScale, Table, row, n0, qpos, kv_end,
                                    qk_scale, g, stride_ks, stride_kh, stride_vs, stride_vh, stride_ss,
                                    stride_tr, offs_d, dmask, BLOCK_N, False, CAUSAL, USE_TABLE, DOT_PREC, KV_FP8)
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _attend(q, acc, m_i, l_i, K, V, KScale, VScale, Table, row, n0, qpos, kv_end,
                                    qk_scale, g, stride_ks, stride_kh, stride_vs, stride_vh, stride_ss,
                                    stride_tr, offs_d, dmask, BLOCK_N, True, CAUSAL, USE_TABLE, DOT_PREC, KV_FP8)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(O + (q0 + qi)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def extend_attention(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, out: torch.Tensor, rows: torch.Tensor,
    kv_lens: torch.Tensor, ext_lens: torch.Tensor, qo_start: torch.Tensor, max_extend: int, *,
    sm_scale: float, table: torch.Tensor | None = None, src_len: int = 0, causal: bool = True,
    block_m: int = 64, block_n: int = 64, num_warps: int | None = None, num_stages: int = 2,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each item's new queries over its keys ``0 .. kv_lens[i]-1``.

    Args:
        q: ``[T, Hq, D]`` packed new tokens (last dim contiguous); item ``i`` owns rows
            ``qo_start[i] .. qo_start[i] + ext_lens[i] - 1``. out: ``[T, Hq, D]``, only those rows written.
        k_buf, v_buf: ``[num_slots, Hkv, D]`` (the new tokens' K/V already stored when ``causal``).
        rows, kv_lens, ext_lens, qo_start: int32/int64 ``[N]`` on the device. ``kv_lens[i] >= ext_lens[i]``
            when ``causal``; ``max_extend`` >= every ``ext_lens[i]`` (host int, sizes the grid).
        table: int32 ``req_to_token``; ``None`` means slot ``row * src_len + pos`` (cross-attention).
        causal: bottom-right causal mask (self-attention); False attends to all ``kv_lens[i]`` keys.
        block_m, block_n, num_warps, num_stages: the tile (queries per program, keys per iteration) and
            launch options; ``num_warps=None`` picks 4 or 8 from the tile size.
        k_scale, v_scale: float32 ``[num_slots, Hkv]`` when k_buf/v_buf hold FP8 e4m3 codes
            (:mod:`engine.kv.fp8`); dequantised in registers.
    Returns:
        ``out``.
    """
    n_items = int(rows.numel())
    _, hq, dim = q.shape
    hkv = k_buf.shape[1]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    if n_items == 0 or max_extend == 0:
        return out
    use_table = table is not None
    group = hq // hkv
    grid = (n_items, hkv, triton.cdiv(max_extend, block_m))
    fp8 = k_scale is not None
    ks, vs = (k_scale, v_scale) if fp8 else (q, q)  # unused without FP8
    _extend_kernel[grid](
        q, k_buf, v_buf, ks, vs, out, table if use_table else rows, rows, kv_lens, ext_lens, qo_start,
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        ks.stride(0), out.stride(0), out.stride(1), table.stride(0) if use_table else src_len,
        GROUP=group, GROUP_P2=triton.next_power_of_2(group), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(dim), HEAD_DIM=dim, CAUSAL=causal, USE_TABLE=use_table,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=fp8,
        num_warps=num_warps or (4 if block_m * triton.next_power_of_2(group) * dim <= 64 * 64 else 8),
        num_stages=num_stages,
    )
    return out
