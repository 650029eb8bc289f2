"""Linear layers: our Triton GEMV for one-token decoder steps (optionally with the norm before it and SwiGLU
after it folded in), cuBLASLt's GELU epilogue for Whisper's encoder MLP, cuBLAS otherwise.

The GEMV beats cuBLAS at M = 1 on every Qwen3-0.6B matrix on an H200 but loses on the larger ones from
M = 2 and on all of them from M = 4 (benchmarks/bench_decode_ops.py, results/decode_ops_h200.json), so only
single rows take it.

Which kernels a model uses is a per-engine choice (:class:`LinearKernels`, from ``EngineConfig``), held by
the modules that call these functions (:class:`UsesLinearKernels`), never a process-wide switch: two
engines in one process keep their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.ops._kernels import fused_kernels, kernels
from engine.ops.activation import silu_and_mul
from engine.ops.norm import pre_rms_norm


@dataclass(frozen=True)
class LinearKernels:
    """Kernel choices for :func:`linear` and :func:`linear_gelu`.

    Attributes:
        gemv_max_rows: most rows sent to the Triton GEMV (CUDA, half precision); 0 sends every product to
            cuBLAS (``EngineConfig.small_batch_gemv`` gives 1).
        fused_gelu_gemm: fc1 + GELU as one cuBLASLt GEMM with a GELU epilogue (``EngineConfig.fused_gelu_gemm``).
        fused_norm_gemv: products that take the GEMV fold the kernels around them into it: residual add +
            RMSNorm into the q/k/v GEMV (:func:`add_rms_norm_linear`), residual add + RMSNorm before and
            SwiGLU after the gate/up GEMV (:func:`add_rms_norm_swiglu_mlp`); ``EngineConfig.fused_decode_gemv``.
            Acts only where the GEMV would run.
    """

    gemv_max_rows: int = 0
    fused_gelu_gemm: bool = False
    fused_norm_gemv: bool = False


REFERENCE = LinearKernels()
"""cuBLAS / torch everywhere: what a module uses until an engine chooses (the CPU's choice too)."""


class UsesLinearKernels:
    """Mixin of modules that call :func:`linear` / :func:`linear_gelu`; they pass ``self.linear_kernels``."""

    linear_kernels: LinearKernels = REFERENCE


def set_linear_kernels(model: nn.Module, choice: LinearKernels) -> None:
    """Give every :class:`UsesLinearKernels` module of ``model`` (itself included) the kernel choice."""
    for m in model.modules():
        if isinstance(m, UsesLinearKernels):
            m.linear_kernels = choice


def linear(x: torch.Tensor, weight: torch.Tensor, choice: LinearKernels = REFERENCE) -> torch.Tensor:
    """``x @ weight.T`` (no bias): ``x`` ``[M, K]``, ``weight`` ``[N, K]`` -> ``[M, N]``, x's dtype.

    CUDA half-precision inputs with ``M <= choice.gemv_max_rows`` go to :func:`engine.ops.triton_kernels.gemv`.
    """
    if _takes_gemv(x, weight, choice):
        return kernels().gemv(x, weight)
    return F.linear(x, weight)


def _takes_gemv(x: torch.Tensor, weight: torch.Tensor, choice: LinearKernels) -> bool:
    """Whether ``x @ weight.T`` runs as our GEMV: CUDA, half precision, ``x`` ``[M, K]`` with unit last stride,
    ``M <= choice.gemv_max_rows`` and a shape the GEMV takes."""
    return (x.is_cuda and x.dim() == 2 and x.shape[0] <= choice.gemv_max_rows and x.stride(-1) == 1
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and kernels().gemv_supported(x.shape[0], x.shape[1]))


def _takes_fused_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                      weight: torch.Tensor, choice: LinearKernels) -> bool:
    """Whether add + RMSNorm + ``@ weight.T`` runs as one fused kernel: the GEMV would run
    (:func:`_takes_gemv`), ``choice.fused_norm_gemv`` is on, and the norm weight and residual fit ``x``."""
    return (choice.fused_norm_gemv and _takes_gemv(x, weight, choice) and weight.stride(-1) == 1
            and norm_weight.dtype == x.dtype and fused_kernels().fused_gemv_supported(x.shape[0], x.shape[1])
            and (residual is None or (residual.shape == x.shape and residual.stride(-1) == 1)))


def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor,
                        choice: LinearKernels = REFERENCE) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm block's entry: ``s = residual + x`` (``s = x`` when ``residual`` is None),
    ``h = rms_norm(s)`` (:mod:`engine.ops.norm`'s rounding), then ``h @ weight.T``.

    Args: ``x``, ``residual`` ``[T, H]`` same dtype; ``norm_weight`` ``[H]``; ``weight`` ``[N, H]``.
    Returns: ``(h @ weight.T [T, N], s [T, H])``; ``s`` is the next residual. Inputs are not modified.
    One Triton kernel (:func:`engine.ops.triton_fused.add_rms_norm_gemv`) where the GEMV would run and
    ``choice.fused_norm_gemv`` is on; otherwise :func:`engine.ops.norm.pre_rms_norm` then :func:`linear`.
    """
    if _takes_fused_gemv(x, residual, norm_weight, weight, choice):
        return fused_kernels().add_rms_norm_gemv(x, residual, norm_weight, eps, weight)
    h, s = pre_rms_norm(x, residual, norm_weight, eps)
    return linear(h, weight, choice), s


def add_rms_norm_swiglu_mlp(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                            gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
                            choice: LinearKernels = REFERENCE) -> tuple[torch.Tensor, torch.Tensor]:
    """A SwiGLU MLP block with its pre-norm: ``s = residual + x``, ``gate_up = rms_norm(s) @ gate_up_weight.T``
    (``[gate | up]``, ``[2I, H]``), ``out = (silu(gate) * up) @ down_weight.T`` (``[H, I]``).

    Returns ``(out [T, H], s [T, H])``. At batch-1 decode with ``choice.fused_norm_gemv`` two kernels
    (:func:`engine.ops.triton_fused.add_rms_norm_gemv_swiglu`, then down's GEMV); otherwise the unfused chain
    (:func:`engine.ops.norm.pre_rms_norm`, :func:`linear`, :func:`silu_and_mul`, :func:`linear`), same
    rounding either way.
    """
    if _takes_fused_gemv(x, residual, norm_weight, gate_up_weight, choice):
        a, s = fused_kernels().add_rms_norm_gemv_swiglu(x, residual, norm_weight, eps, gate_up_weight)
        return linear(a, down_weight, choice), s
    h, s = pre_rms_norm(x, residual, norm_weight, eps)
    return linear(silu_and_mul(linear(h, gate_up_weight, choice)), down_weight, choice), s


_HAS_GELU_EPILOGUE = hasattr(torch, "_addmm_activation")  # private op (torch >= 1.13)


def linear_gelu_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x @ weight.T + bias)`` with the exact (erf) GELU, rounded as ``transformers``' Whisper MLP: the
    linear's output is rounded to x's dtype before the GELU. ``x`` ``[..., K]``, ``weight`` ``[N, K]``,
    ``bias`` ``[N]`` -> ``[..., N]``."""
    return F.gelu(F.linear(x, weight, bias))


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                choice: LinearKernels = REFERENCE) -> torch.Tensor:
    """As :func:`linear_gelu_reference`; with ``choice.fused_gelu_gemm``, CUDA half-precision inputs take one
    cuBLASLt GEMM whose epilogue adds the bias and applies GELU to the float32 accumulator (``CUBLASLT_EPILOGUE_GELU_BIAS`` through
    ``torch._addmm_activation``), so the ``[..., N]`` pre-activation never goes to memory.

    That epilogue is GELU's tanh form (Hendrycks & Gimpel 2016, eq. 2), which differs from erf by at most
    4.7e-4 (at x = 2.70), a thirty-third of bf16's spacing there; with one rounding instead of two the fused
    result is closer to the exact float32 value than the reference's, and it skips one pass over the
    ``[..., N]`` activations (errors and times on Whisper-medium's fc1: ``gemm_gelu`` in
    ``benchmarks/results/diag_encoder_h200.json``).

    ``x`` ``[..., K]`` -> ``[..., N]``, x's dtype.
    """
    if (choice.fused_gelu_gemm and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and x.dim() >= 2
            and weight.dtype == x.dtype and bias is not None and bias.dtype == x.dtype and _HAS_GELU_EPILOGUE):
        y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
        return y.view(*x.shape[:-1], weight.shape[0])
    return linear_gelu_reference(x, weight, bias)

