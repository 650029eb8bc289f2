"""RMSNorm and LayerNorm, each also fused with the residual add before it.

RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization") rounds as ``transformers``'
``Qwen3RMSNorm``: the mean of squares and the scaling in float32, the scaled row cast back to the input
dtype, then multiplied by the weight in that dtype. LayerNorm (Whisper's encoder) rounds as ``nn.LayerNorm``:
everything in float32, one rounding at the end. The residual add rounds to the input dtype before the norm
reads it, as the unfused ``x + residual`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def pre_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm block's input: :func:`add_rms_norm` of ``x`` and ``residual``, or, before the first block
    (``residual`` None), ``(rms_norm(x), x)``. Returns ``(normed, next residual)``."""
    if residual is None:
        return rms_norm(x, weight, eps), x
    return add_rms_norm(x, residual, weight, eps)


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         eps: float) -> torch.Tensor:
    """``nn.LayerNorm`` over the last dim (Ba et al. 2016, "Layer Normalization"): ``x`` ``[..., H]``,
    ``weight``/``bias`` ``[H]``. In bf16/fp16 torch computes the mean, the biased variance and the affine
    map in float32 and rounds once at the end; this is that op, so the reference rounds as HF's modules."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of the rows of ``x`` ``[..., H]``: one Triton kernel for contiguous CUDA tensors (same
    rounding as :func:`layer_norm_reference`, float32 statistics in another summation order), else the
    reference. Returns ``x``'s shape and dtype."""
    if x.is_cuda and x.is_contiguous() and x.numel():
        return kernels().layer_norm(x.view(-1, x.shape[-1]), weight, bias, eps).view(x.shape)
    return layer_norm_reference(x, weight, bias, eps)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = residual + x`` (rounded to the dtype, as the unfused add) and ``layer_norm(s)``: the residual
    add of a pre-LN block fused with the next block's LayerNorm.

    Args: ``x``, ``residual`` ``[..., H]`` same shape and dtype; ``weight``, ``bias`` ``[H]``.
    Returns: ``(normed, s)``, both ``x``'s shape; ``s`` is the new residual stream. Inputs are not modified.
    Raises ValueError (CUDA path) if the weight or bias dtype differs from ``x``'s.
    """
    if x.is_cuda and x.is_contiguous() and residual.is_contiguous() and x.numel():
        h = x.shape[-1]
        out, s = kernels().add_layer_norm(x.view(-1, h), residual.view(-1, h), weight, bias, eps)
        return out.view(x.shape), s.view(x.shape)
    s = residual + x
    return layer_norm_reference(s, weight, bias, eps), s
