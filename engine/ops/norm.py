"""RMSNorm and residual-add + RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").

Rounding follows ``transformers``' ``Qwen3RMSNorm``: the mean of squares and the scaling in float32, the
scaled row cast back to the input dtype, then multiplied by the weight in that dtype. The residual add
rounds to the input dtype before the norm reads it, as the unfused ``x + residual`` does.
"""

from __future__ import annotations

import torch

from engine.ops._kernels import kernels


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps))`` over the last dim; ``x`` ``[..., H]``, ``weight`` ``[H]``
    (same dtype). Returns ``x``'s shape and dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows of ``x`` ``[T, H]``: one Triton kernel for CUDA tensors, else the reference.

    Raises ValueError (CUDA path) if ``weight``'s dtype differs from ``x``'s or the row is not contiguous.
    """
    if x.is_cuda and x.dim() == 2:
        return kernels().rms_norm(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = residual + x`` (rounded to the dtype) and ``rms_norm(s)``: the pre-norm block boundary.

    Args: ``x``, ``residual`` ``[T, H]`` same dtype; ``weight`` ``[H]``.
    Returns: ``(normed [T, H], s [T, H])``; ``s`` is the next residual. Neither input is modified.
    """
    if x.is_cuda and x.dim() == 2:
        return kernels().add_rms_norm(x, residual, weight, eps)
    s = residual + x
    return rms_norm_reference(s, weight, eps), s
