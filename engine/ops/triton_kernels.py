"""Triton kernels of :mod:`engine.ops` (CUDA; the tests also run them under ``TRITON_INTERPRET=1``).

Every kernel reproduces its torch reference's rounding: ``_rnd`` rounds a float32 value to the output
dtype (bf16: on the bits) and back, wherever the reference materialises an intermediate in that dtype. One program handles
one token row (for the rotary kernel: all heads of one token), so a decode step of ``B`` tokens is ``B``
programs of one short launch each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rnd(x, DT: tl.constexpr):
    # bf16 rounding (to nearest, ties to even) done on the bits: a plain fp32 -> bf16 -> fp32 cast pair
    # was not kept by the compiler in the rotary kernel on an H200 (14-21% of outputs one step off).
    if DT == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def _load_row(X, R, ResOut, row, stride_x, stride_r, stride_ro, offs, mask, DT: tl.constexpr,
              HAS_RES: tl.constexpr):
    """Row ``row`` of ``X`` in float32; with ``HAS_RES`` plus the residual row, rounded to ``DT`` as the
    unfused add would be and stored to ``ResOut`` (the new residual stream)."""
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        x = _rnd(x + r, DT)
        tl.store(ResOut + row * stride_ro + offs, x.to(DT), mask=mask)
    return x


@triton.jit
def _rms_norm_kernel(X, R, W, Out, ResOut, stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dt = Out.dtype.element_ty
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = _load_row(X, R, ResOut, row, stride_x, stride_r, stride_ro, offs, mask, dt, HAS_RES)
    var = tl.sum(x * x, axis=0) / n_cols
    n = _rnd(x * (1.0 / tl.sqrt(var + eps)), dt)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (n * w).to(dt), mask=mask)


def _check_rows(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"expected [T, H] rows with unit stride, got shape {tuple(x.shape)}")
    if weight.dtype != x.dtype or weight.shape != (x.shape[1],):
        raise ValueError(f"weight {tuple(weight.shape)} {weight.dtype} does not fit x {tuple(x.shape)} {x.dtype}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`engine.ops.norm.rms_norm` for ``x`` ``[T, H]``. Raises ValueError on layout/dtype mismatch."""
    _check_rows(x, weight)
    out = torch.empty_like(x)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](x, x, weight, out, out, x.stride(0), x.stride(0), out.stride(0),
                                        out.stride(0), x.shape[1], eps, HAS_RES=False,
                                        BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`engine.ops.norm.add_rms_norm`. Raises ValueError on layout/dtype mismatch."""
    _check_rows(x, weight)
    _check_rows(residual, weight)
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](x, residual, weight, out, res_out, x.stride(0), residual.stride(0),
                                        out.stride(0), res_out.stride(0), x.shape[1], eps, HAS_RES=True,
                                        BLOCK=triton.next_power_of_2(x.shape[1]))
    return out, res_out


@triton.jit
def _layer_norm_kernel(X, R, W, B, Out, ResOut, stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                       HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dt = Out.dtype.element_ty
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = _load_row(X, R, ResOut, row, stride_x, stride_r, stride_ro, offs, mask, dt, HAS_RES)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)  # biased variance, as nn.LayerNorm
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (xc * rstd * w + b).to(dt), mask=mask)


def _launch_layer_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                       bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    _check_rows(x, weight)
    _check_rows(x, bias)
    if residual is not None:
        _check_rows(residual, weight)
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res_out = torch.empty_like(out) if residual is not None else None
    if x.shape[0]:
        r, ro = (residual, res_out) if residual is not None else (x, out)
        _layer_norm_kernel[(x.shape[0],)](x, r, weight, bias, out, ro, x.stride(0), r.stride(0),
                                          out.stride(0), ro.stride(0), x.shape[1], eps,
                                          HAS_RES=residual is not None,
                                          BLOCK=triton.next_power_of_2(x.shape[1]))
    return out, res_out


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`engine.ops.norm.layer_norm` for ``x`` ``[T, H]``. Raises ValueError on layout/dtype mismatch."""
    return _launch_layer_norm(x, None, weight, bias, eps)[0]


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`engine.ops.norm.add_layer_norm` for ``[T, H]`` rows: ``(normed, residual + x)``. Raises
    ValueError on layout/dtype/shape mismatch."""
    out, s = _launch_layer_norm(x, residual, weight, bias, eps)
    return out, s


@triton.jit
def _silu_mul_kernel(GU, Out, stride_g, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dt = Out.dtype.element_ty
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    g = tl.load(GU + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_g + n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    a = _rnd(g / (1.0 + tl.exp(-g)), dt)
    tl.store(Out + row * stride_o + offs, (a * u).to(dt), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """:func:`engine.ops.activation.silu_and_mul` for ``gate_up`` ``[T, 2I]`` with unit last stride."""
    if gate_up.stride(-1) != 1:
        raise ValueError("gate_up must have unit stride in its last dim")
    t, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    if t:
        _silu_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, gate_up.stride(0), out.stride(0), n,
                                                     BLOCK=block)
    return out


@triton.jit
def _gemv_kernel(X, W, Out, N, stride_xm, stride_wn, stride_om, M: tl.constexpr, MP: tl.constexpr,
                 KB: tl.constexpr, CHUNKS: tl.constexpr, BN: tl.constexpr):
    # K = CHUNKS x KB. The chunk loop is unrolled, so all weight loads of the [BN, K] tile can be in flight
    # together (a bandwidth-bound product needs that); the few activation rows reuse each chunk.
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, KB)
    rm = tl.arange(0, MP)
    nmask = rn < N
    acc = tl.zeros((MP, BN), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):
        w = tl.load(W + rn[:, None].to(tl.int64) * stride_wn + c * KB + rk[None, :], mask=nmask[:, None],
                    other=0.0).to(tl.float32)
        for m in tl.static_range(M):
            x = tl.load(X + m * stride_xm + c * KB + rk).to(tl.float32)
            part = tl.sum(w * x[None, :], axis=1)
            acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    out = Out + rm[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty), mask=(rm[:, None] < M) & nmask[None, :])


def gemv_tile(k: int) -> tuple[int, int]:
    """(rows of ``W`` per program, warps) for a GEMV over K: K >= 2048 is fastest with one row and one warp,
    K = 1024 with two rows and four warps (swept at M = 1 over 1-16 rows x 1-8 warps,
    ``benchmarks/results/archive/decode_ops_h200_3974339_gemv_sweep.json``). Many small programs keep
    the most loads in flight."""
    return (1, 1) if k >= 2048 else (2, 4)


def gemv_supported(m: int, k: int) -> bool:
    """Shapes :func:`gemv` takes: 1-8 rows and K a multiple of 64 (split into power-of-two chunks)."""
    return 1 <= m <= 8 and k % 64 == 0


def gemv(x: torch.Tensor, weight: torch.Tensor, block_n: int | None = None,
         num_warps: int | None = None) -> torch.Tensor:
    """``x @ weight.T`` for a few rows: ``x`` ``[M, K]``, ``weight`` ``[N, K]`` (unit last strides, same
    dtype), float32 accumulation; returns ``[M, N]`` in x's dtype. For decode at batch 1-8, where cuBLAS
    picks tiles built for large M and leaves much of the HBM bandwidth unused.

    ``block_n`` / ``num_warps`` override the tile choice (:func:`gemv_tile`; for tuning).
    Raises ValueError for shapes outside :func:`gemv_supported` or mismatched layouts/dtypes.
    """
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or weight.dtype != x.dtype or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"gemv: x {tuple(x.shape)} {x.dtype} vs weight {tuple(weight.shape)} {weight.dtype}")
    if not gemv_supported(m, k):
        raise ValueError(f"gemv: M={m}, K={k} not supported")
    kb = min(k & -k, 1024)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    tile = gemv_tile(k)
    bn, warps = block_n or tile[0], num_warps or tile[1]
    _gemv_kernel[(triton.cdiv(n, bn),)](x, weight, out, n, x.stride(0), weight.stride(0), out.stride(0),
                                        M=m, MP=triton.next_power_of_2(m), KB=kb, CHUNKS=k // kb, BN=bn,
                                        num_warps=warps)
    return out
