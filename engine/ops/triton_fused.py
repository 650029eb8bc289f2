"""Triton GEMVs with the decoder's elementwise prologue folded in, for single-row (batch-1 decode) steps.

At batch 1 a Qwen3 decoder layer was ten kernels, most of their non-bandwidth time per-kernel latency
(``benchmarks/results/engine_h200.md``). These fold the kernel before a GEMV into the GEMV's programs:

- :func:`add_rms_norm_gemv`: residual add + RMSNorm + ``h @ W.T`` (the q/k/v projection);
- :func:`add_rms_norm_gemv_swiglu`: residual add + RMSNorm + gate/up GEMV + SwiGLU as its epilogue (each
  program owns matching gate and up rows, so nothing is recomputed).

Every program reduces the whole activation row for the norm (1,024 elements, read from L2), so no program
waits on another and no second kernel runs. Measured on an H200 (``benchmarks/bench_decode_fusions.py``,
``results/decode_fusions_h200.json``); SwiGLU folded into the down GEMV's prologue instead lost and is
gone. Rounding is that of the unfused chain, step by step: :func:`engine.ops.norm.rms_norm_reference`
and :func:`engine.ops.activation.silu_and_mul_reference` (each intermediate the reference materialises
in the dtype is rounded to it with ``_rnd``), then a float32 dot product as
:func:`engine.ops.triton_kernels.gemv` sums it (chunks of ``KB``, in order). The outputs are rounded
with ``_rnd`` too, so the interpreter (whose bf16 cast truncates) rounds them as the GPU does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.triton_kernels import _rnd, gemv_tile

_HALF = (torch.bfloat16, torch.float16)


@triton.jit
def _norm_gemv_kernel(X, R, NW, W, Out, ResOut, N, eps, stride_wn, HP: tl.constexpr, KB: tl.constexpr,
                      CHUNKS: tl.constexpr, BN: tl.constexpr, HAS_RES: tl.constexpr, GLU: tl.constexpr):
    # H = CHUNKS x KB. The row statistics are those of _rms_norm_kernel (one HP block, the same reduction),
    # so h is the unfused kernel's h; the chunks then read the row again (L1/L2) beside each weight chunk.
    # GLU: W is [gate | up] (2N rows); the program takes gate rows rn and up rows N + rn and writes
    # silu(gate) * up, rounded as gate_up's GEMV output and then silu_and_mul_reference round it.
    pid = tl.program_id(0)
    dt = Out.dtype.element_ty
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, KB)
    nmask = rn < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    acc_up = tl.zeros((BN,), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):
        wp = W + rn[:, None].to(tl.int64) * stride_wn + c * KB + rk[None, :]
        w = tl.load(wp, mask=nmask[:, None], other=0.0).to(tl.float32)
        if GLU:
            w_up = tl.load(wp + N * stride_wn, mask=nmask[:, None], other=0.0).to(tl.float32)
        if c == 0:
            # The row statistics after the first weight loads are issued: the reduction's barriers would
            # otherwise hold those HBM loads back until the row has come from L2 and been reduced.
            offs = tl.arange(0, HP)
            mask = offs < CHUNKS * KB
            s = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            if HAS_RES:
                s = _rnd(s + tl.load(R + offs, mask=mask, other=0.0).to(tl.float32), dt)
                if pid == 0:  # exactly one program writes the new residual stream
                    tl.store(ResOut + offs, s.to(dt), mask=mask)
            rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / (CHUNKS * KB) + eps)
        xc = tl.load(X + c * KB + rk).to(tl.float32)
        if HAS_RES:
            xc = _rnd(xc + tl.load(R + c * KB + rk).to(tl.float32), dt)
        nw = tl.load(NW + c * KB + rk).to(tl.float32)
        h = _rnd(_rnd(xc * rstd, dt) * nw, dt)  # cast to the dtype, then times the weight in the dtype
        acc += tl.sum(w * h[None, :], axis=1)
        if GLU:
            acc_up += tl.sum(w_up * h[None, :], axis=1)
    if GLU:
        g = _rnd(acc, dt)
        y = _rnd(_rnd(g / (1.0 + tl.exp(-g)), dt) * _rnd(acc_up, dt), dt)
    else:
        y = _rnd(acc, dt)
    tl.store(Out + rn, y.to(dt), mask=nmask)


def fused_gemv_supported(m: int, k: int) -> bool:
    """Shapes the fused GEMVs take: one row, and K a multiple of 64 (split into power-of-two chunks as
    :func:`engine.ops.triton_kernels.gemv` splits it). Batch-1 decode is the only step they are for: at
    more rows the GEMV itself stops paying (``engine.ops.linear``)."""
    return m == 1 and k > 0 and k % 64 == 0


def fused_gemv_tile(k: int, glu: bool = False) -> tuple[int, int]:
    """(rows of ``W`` per program, warps) of :func:`add_rms_norm_gemv` (``glu=False``) and
    :func:`add_rms_norm_gemv_swiglu` (``glu``: rows of gate, each with its up row). At K = 1,024 (Qwen3-0.6B)
    the fastest within one bf16 step of the unfused output in the H200 sweep (1/2/4/8 rows x 1/2/4 warps,
    ``results/decode_fusions_h200.json``): 4 rows / 1 warp, and 2 / 2 with the SwiGLU epilogue (more rows
    reduce the row's norm fewer times); other K take :func:`engine.ops.triton_kernels.gemv_tile`'s."""
    if k == 1024:
        return (2, 2) if glu else (4, 1)
    return gemv_tile(k)


def _check(x: torch.Tensor, weight: torch.Tensor, k: int, what: str) -> None:
    if (x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != k or x.stride(-1) != 1
            or weight.stride(-1) != 1 or weight.dtype != x.dtype or x.dtype not in _HALF
            or not fused_gemv_supported(x.shape[0], k)):
        raise ValueError(f"{what}: x {tuple(x.shape)} {x.dtype} vs weight {tuple(weight.shape)} "
                         f"{weight.dtype}: needs one half-precision row, unit last strides, K = {k} a "
                         "multiple of 64")


def _grid_tile(k: int, n: int, block_n: int | None, num_warps: int | None,
               glu: bool) -> tuple[tuple[int], int, int, int]:
    kb = min(k & -k, 1024)
    tile = fused_gemv_tile(k, glu)
    bn, warps = block_n or tile[0], num_warps or tile[1]
    if bn & (bn - 1) or warps & (warps - 1):  # Triton block shapes and warp counts are powers of two
        raise ValueError(f"block_n {bn} and num_warps {warps} must be powers of two")
    return (triton.cdiv(n, bn),), kb, bn, warps


def _launch_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor, glu: bool, block_n: int | None, num_warps: int | None,
                      what: str) -> tuple[torch.Tensor, torch.Tensor]:
    h = x.shape[-1]
    _check(x, weight, h, what)
    if norm_weight.shape != (h,) or norm_weight.dtype != x.dtype or norm_weight.stride(-1) != 1:
        raise ValueError(f"{what}: norm weight {tuple(norm_weight.shape)} {norm_weight.dtype} "
                         f"does not fit x {tuple(x.shape)} {x.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                 or residual.stride(-1) != 1):
        raise ValueError(f"{what}: residual {tuple(residual.shape)} {residual.dtype} does not "
                         f"match x {tuple(x.shape)} {x.dtype}")
    if glu and weight.shape[0] % 2:
        raise ValueError(f"{what}: [gate | up] weight needs an even row count, got {weight.shape[0]}")
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else x
    grid, kb, bn, warps = _grid_tile(h, n, block_n, num_warps, glu)
    _norm_gemv_kernel[grid](x, residual if residual is not None else x, norm_weight, weight, out, res_out, n,
                            eps, weight.stride(0), HP=triton.next_power_of_2(h), KB=kb, CHUNKS=h // kb, BN=bn,
                            HAS_RES=residual is not None, GLU=glu, num_warps=warps)
    return out, res_out


def add_rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor, block_n: int | None = None,
                      num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = residual + x`` (rounded to the dtype; ``s = x`` when ``residual`` is None), ``h = rms_norm(s)``
    (rounded as :func:`engine.ops.norm.rms_norm_reference`), then ``h @ weight.T`` (float32 accumulation)
    in one kernel.

    Args: ``x``, ``residual`` ``[1, H]``; ``norm_weight`` ``[H]``; ``weight`` ``[N, H]``; all bf16 or all
    float16, unit last strides, H a multiple of 64. ``block_n`` / ``num_warps`` override
    :func:`fused_gemv_tile` (for tuning).
    Returns: ``(h @ weight.T [1, N], s [1, H])``; ``s`` is the next residual (``x`` itself without a
    residual). Inputs are not modified.
    Raises ValueError for shapes outside :func:`fused_gemv_supported` or mismatched layouts/dtypes.
    """
    return _launch_norm_gemv(x, residual, norm_weight, eps, weight, False, block_n, num_warps,
                             "add_rms_norm_gemv")


def add_rms_norm_gemv_swiglu(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                             eps: float, gate_up_weight: torch.Tensor, block_n: int | None = None,
                             num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`add_rms_norm_gemv` with ``gate_up_weight`` ``[2I, H]`` = ``[gate | up]``, then SwiGLU on the
    product in the same kernel: returns ``(silu(gate) * up [1, I], s [1, H])``, rounded as the unfused chain
    (the GEMV's output in the dtype, then :func:`engine.ops.activation.silu_and_mul_reference`). Each
    program takes matching gate and up rows, so nothing is recomputed. Raises ValueError as :func:`add_rms_norm_gemv`, or for an odd row
    count.
    """
    return _launch_norm_gemv(x, residual, norm_weight, eps, gate_up_weight, True, block_n, num_warps,
                             "add_rms_norm_gemv_swiglu")
