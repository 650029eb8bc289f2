"""The fused q/k RMSNorm + rotary (+ KV store) Triton kernel of Qwen3 attention (CUDA; the tests also run it
under ``TRITON_INTERPRET=1``), with the FP8 e4m3 quantisation of :mod:`engine.kv.fp8` when the pool is FP8.

Rounding follows :func:`engine.ops.rotary.qk_norm_rope_reference` (``_rnd`` wherever the reference holds an
intermediate in the activation dtype); FP8 codes follow :func:`engine.kv.fp8.quantize` exactly (``_e4m3``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from engine.ops.triton_kernels import _rnd

if TYPE_CHECKING:
    from engine.kv import KVDestination

_E4M3_MAX = tl.constexpr(448.0)  # engine.kv.fp8.E4M3_MAX; a jit function reads a module global only as a constexpr


@triton.jit
def _e4m3(x):
    # x (float32, |x| <= 448) rounded to the nearest e4m3 value, ties to even, returned as float32, so the
    # cast to float8e4nv that follows is exact. Done on the bits because the Triton 3.5 interpreter's cast
    # drops a carry out of the mantissa (-125.4 became -64, not -128); on the GPU it costs a few integer ops.
    a = tl.abs(x)
    u = a.to(tl.uint32, bitcast=True)
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)  # 3 mantissa bits
    sub = ((a * 512.0 + 8388608.0) - 8388608.0) / 512.0  # below 2**-6: multiples of 2**-9 (2**23: rint)
    r = tl.where(a >= 0.015625, normal, sub)
    return tl.where(x < 0, -r, r)


@triton.jit
def _fp8_scale(amax):
    # engine.kv.fp8.quantize's scale of a row whose largest magnitude is amax ([R] -> [R, 1])
    return tl.where(amax > 0, amax / _E4M3_MAX, 1.0)[:, None]


@triton.jit
def _fp8_codes(x, scale, DT: tl.constexpr):
    return _e4m3(tl.clamp(x / scale, -_E4M3_MAX, _E4M3_MAX)).to(DT)


@triton.jit
def _qk_norm_rope_kernel(QKV, Pos, Cos, Sin, QW, KW, Q, K, KC, VC, KS, VS, Loc, stride_t, stride_qt, stride_qh,
                         stride_kt, stride_kh, stride_c, stride_kcs, stride_kch, stride_vcs, stride_vch,
                         stride_ss, eps, NQ: tl.constexpr, NKV: tl.constexpr, HB: tl.constexpr,
                         VB: tl.constexpr, D: tl.constexpr, STORE_KV: tl.constexpr, FP8: tl.constexpr):
    # One program per token, all its q and k heads as the rows of one [HB, D/2] tile pair: one program per
    # (token, head) spent more time scheduling 64-element programs than moving data (12% of the engine
    # stream's kernel time at W-short c64 on an H200, mostly in 2,048-4,096-token prefill graphs).
    t = tl.program_id(0).to(tl.int64)
    dt = Q.dtype.element_ty
    HALF: tl.constexpr = D // 2
    offs = tl.arange(0, HALF)[None, :]
    h = tl.arange(0, HB)[:, None]
    live = (h < NQ + NKV) & (offs < HALF)
    is_q = h < NQ
    src = QKV + t * stride_t + h * D  # q heads, then k heads, are contiguous in a qkv row
    x1 = tl.load(src + offs, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=live, other=0.0).to(tl.float32)
    w1 = tl.where(is_q, tl.load(QW + offs), tl.load(KW + offs)).to(tl.float32)
    w2 = tl.where(is_q, tl.load(QW + HALF + offs), tl.load(KW + HALF + offs)).to(tl.float32)
    var = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D
    r = (1.0 / tl.sqrt(var + eps))[:, None]
    n1 = _rnd(_rnd(x1 * r, dt) * w1, dt)
    n2 = _rnd(_rnd(x2 * r, dt) * w2, dt)
    pos = tl.load(Pos + t)
    c = tl.load(Cos + pos * stride_c + offs).to(tl.float32)  # tables already in the activation dtype
    s = tl.load(Sin + pos * stride_c + offs).to(tl.float32)
    o1 = _rnd(n1 * c, dt) - _rnd(n2 * s, dt)
    o2 = _rnd(n2 * c, dt) + _rnd(n1 * s, dt)
    qm = live & is_q
    km = live & (h >= NQ)
    qdst = Q + t * stride_qt + tl.minimum(h, NQ - 1) * stride_qh
    tl.store(qdst + offs, o1.to(dt), mask=qm)
    tl.store(qdst + HALF + offs, o2.to(dt), mask=qm)
    kh = tl.maximum(h - NQ, 0)
    if STORE_KV:  # k straight into the KV pool; v copied there by the same program
        slot = tl.load(Loc + t).to(tl.int64)
        kdst = KC + slot * stride_kcs + kh * stride_kch
        vh = tl.arange(0, VB)[:, None]
        vd = tl.arange(0, D)[None, :]
        vm = (vh < NKV) & (vd < D)
        v = tl.load(QKV + t * stride_t + (NQ + NKV + vh) * D + vd, mask=vm, other=0.0)
        vdst = VC + slot * stride_vcs + vh * stride_vch + vd
        if FP8:  # K is quantised from its activation-dtype value (_rnd), as the reference's k tensor holds it
            k1 = _rnd(o1, dt)
            k2 = _rnd(o2, dt)
            kscale = _fp8_scale(tl.maximum(tl.max(tl.where(km, tl.abs(k1), 0.0), axis=1),
                                           tl.max(tl.where(km, tl.abs(k2), 0.0), axis=1)))
            tl.store(kdst + offs, _fp8_codes(k1, kscale, KC.dtype.element_ty), mask=km)
            tl.store(kdst + HALF + offs, _fp8_codes(k2, kscale, KC.dtype.element_ty), mask=km)
            tl.store(KS + slot * stride_ss + kh, kscale, mask=(h >= NQ) & (h < NQ + NKV))
            vf = v.to(tl.float32)
            vscale = _fp8_scale(tl.max(tl.where(vm, tl.abs(vf), 0.0), axis=1))
            tl.store(vdst, _fp8_codes(vf, vscale, VC.dtype.element_ty), mask=vm)
            tl.store(VS + slot * stride_ss + vh, vscale, mask=vh < NKV)
        else:
            tl.store(kdst + offs, o1.to(KC.dtype.element_ty), mask=km)
            tl.store(kdst + HALF + offs, o2.to(KC.dtype.element_ty), mask=km)
            tl.store(vdst, v.to(VC.dtype.element_ty), mask=vm)
    else:
        kdst = K + t * stride_kt + kh * stride_kh
        tl.store(kdst + offs, o1.to(dt), mask=km)
        tl.store(kdst + HALF + offs, o2.to(dt), mask=km)


def qk_norm_rope(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 q_weight: torch.Tensor, k_weight: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                 eps: float, kv_dest: KVDestination | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`engine.ops.rotary.qk_norm_rope` with cos/sin tables ``[P, D/2]`` in qkv's dtype. With ``kv_dest``
    (pool buffers ``[S, Hkv, D]``, int64 slots ``[T]``, FP8 scales ``[S, Hkv]`` when quantised) the new K and
    V go straight to the pool and ``(q, None, None)`` is returned.

    Raises ValueError unless ``qkv`` is ``[T, (Hq + 2 Hkv) * D]`` with unit last stride and D a power of 2.
    """
    d = q_weight.shape[0]
    t = qkv.shape[0]
    if qkv.dim() != 2 or qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * d or qkv.stride(-1) != 1:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not hold {num_q_heads}+2x{num_kv_heads} heads of {d}")
    if d & (d - 1) or d < 2:
        raise ValueError(f"head_dim must be a power of two, got {d}")
    q = torch.empty((t, num_q_heads, d), dtype=qkv.dtype, device=qkv.device)
    fp8 = kv_dest is not None and kv_dest.quantized
    if kv_dest is None:
        k = torch.empty((t, num_kv_heads, d), dtype=qkv.dtype, device=qkv.device)
        kc, vc, loc = k, k, positions
    else:
        kc, vc, loc = kv_dest.k, kv_dest.v, kv_dest.slots
        k = q  # unused by the kernel when it stores to the pool
    ks, vs = (kv_dest.k_scale, kv_dest.v_scale) if fp8 else (q, q)  # unused without FP8
    if t:
        _qk_norm_rope_kernel[(t,)](
            qkv, positions, cos, sin, q_weight, k_weight, q, k, kc, vc, ks, vs, loc, qkv.stride(0), q.stride(0),
            q.stride(1), k.stride(0), k.stride(1), cos.stride(0), kc.stride(0), kc.stride(1), vc.stride(0),
            vc.stride(1), ks.stride(0), eps, NQ=num_q_heads, NKV=num_kv_heads,
            HB=triton.next_power_of_2(num_q_heads + num_kv_heads), VB=triton.next_power_of_2(num_kv_heads),
            D=d, STORE_KV=kv_dest is not None, FP8=fp8)
    if kv_dest is not None:
        return q, None, None
    v = qkv[:, (num_q_heads + num_kv_heads) * d:].view(t, num_kv_heads, d)
    return q, k, v
