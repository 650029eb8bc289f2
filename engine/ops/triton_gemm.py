"""Triton GEMM with a bias + exact (erf) GELU epilogue: ``gelu(x @ weight.T + bias)`` in one kernel.

Why: in Whisper's encoder MLP the fc1 output ``[T, 4d]`` is the largest activation; written by the GEMM,
then read and rewritten by a separate GELU, it costs two extra passes over 4d-wide rows (9% of an
8-window encoder forward on the H200). cuBLASLt's fused GELU epilogue is the tanh approximation, not the
erf form Whisper was trained with, so the epilogue is ours. Imported lazily (CUDA only), like
:mod:`engine.ops.triton_kernels`.

Tiling: the output is cut into ``BLOCK_M x BLOCK_N`` tiles, grouped ``GROUP_M`` tiles down a column so
neighbouring programs share weight tiles in L2; the K loop accumulates in float32 (``tl.dot`` lowers to
wgmma on Hopper); bias and GELU act on the float32 accumulator and the result is rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); the first is the default, the rest are tried by
# benchmarks/diag_encoder.py. All divide Whisper's K (d = 384..1280, 4d) by BLOCK_K = 64.
CONFIGS = [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
           (128, 128, 64, 8, 4), (64, 256, 64, 4, 4)]


@triton.jit
def _linear_gelu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, stride_xm, stride_wn, stride_ym, K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % rows
    pid_n = (pid % group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows/columns read row 0 / column 0 (valid memory) and are never stored.
    safe_m = tl.where(offs_m < M, offs_m, 0)
    safe_n = tl.where(offs_n < N, offs_n, 0)
    x_ptrs = x_ptr + safe_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + safe_n[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, K, BLOCK_K):  # K % BLOCK_K == 0 (checked by the wrapper); K is a constexpr
        acc = tl.dot(tl.load(x_ptrs), tl.load(w_ptrs), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc += tl.load(b_ptr + safe_n).to(tl.float32)[None, :]
    y = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                config: tuple[int, int, int, int, int] = CONFIGS[0]) -> torch.Tensor:
    """``gelu(x @ weight.T + bias)`` with the exact erf GELU (Hendrycks & Gimpel 2016), one kernel.

    Args:
        x: ``[M, K]`` bf16/fp16 CUDA, rows contiguous (``stride(-1) == 1``).
        weight: ``[N, K]`` same dtype, rows contiguous (``nn.Linear``'s layout).
        bias: ``[N]`` same dtype.
        config: ``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)``.

    Returns:
        ``[M, N]`` in x's dtype; accumulated, biased and activated in float32, rounded once.

    Raises:
        ValueError: shapes, dtypes or strides not as above, or ``K`` not a multiple of ``BLOCK_K``.
    """
    bm, bn, bk, warps, stages = config
    m, k = x.shape
    n = weight.shape[0]
    if (weight.shape[1] != k or bias.shape != (n,) or x.stride(-1) != 1 or weight.stride(-1) != 1
            or not bias.is_contiguous() or weight.dtype != x.dtype or bias.dtype != x.dtype or k % bk):
        raise ValueError(f"linear_gelu: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} "
                         f"{weight.dtype}, bias {tuple(bias.shape)}: need [M, K] @ [N, K].T + [N], one "
                         f"dtype, unit last stride, K % {bk} == 0")
    y = x.new_empty(m, n)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _linear_gelu_kernel[grid](x, weight, bias, y, m, n, x.stride(0), weight.stride(0), y.stride(0), K=k,
                              BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps,
                              num_stages=stages)
    return y
