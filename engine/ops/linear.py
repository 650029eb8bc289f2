"""Linear layers: our Triton GEMV for one-token decoder steps, cuBLASLt's GELU epilogue for Whisper's
encoder MLP, cuBLAS otherwise.

On an H200 (benchmarks/bench_decode_ops.py) the GEMV beats cuBLAS at M = 1 on every Qwen3-0.6B matrix
(o_proj 3.6 vs 12.8 us, down 4.6 vs 7.6, qkv 4.2 vs 5.4, gate_up 5.3 vs 6.1, lm_head 72 vs 78) but loses
on the larger ones from M = 2 and on all of them from M = 4, so only single rows take it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops._kernels import kernels

# Most rows sent to the Triton GEMV; 0 sends everything to cuBLAS. Set by EngineConfig.small_batch_gemv
# (process-wide: kernels are chosen per call, and every engine in a process shares the GPU).
GEMV_MAX_ROWS = 1


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` (no bias): ``x`` ``[M, K]``, ``weight`` ``[N, K]`` -> ``[M, N]``, x's dtype.

    CUDA half-precision inputs with ``M <= GEMV_MAX_ROWS`` go to :func:`engine.ops.triton_kernels.gemv`.
    """
    if (x.is_cuda and x.dim() == 2 and x.shape[0] <= GEMV_MAX_ROWS and x.stride(-1) == 1
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and kernels().gemv_supported(x.shape[0], x.shape[1])):
        return kernels().gemv(x, weight)
    return F.linear(x, weight)


# Whisper's fc1 + GELU in one cuBLASLt GEMM (GELU epilogue) on CUDA; False keeps the GEMM and a separate
# erf GELU. Set by EngineConfig.fused_gelu_gemm (process-wide, like GEMV_MAX_ROWS).
FUSED_GELU_GEMM = True
_HAS_GELU_EPILOGUE = hasattr(torch, "_addmm_activation")  # private op (torch >= 1.13)


def linear_gelu_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x @ weight.T + bias)`` with the exact (erf) GELU, rounded as ``transformers``' Whisper MLP: the
    linear's output is rounded to x's dtype before the GELU. ``x`` ``[..., K]``, ``weight`` ``[N, K]``,
    ``bias`` ``[N]`` -> ``[..., N]``."""
    return F.gelu(F.linear(x, weight, bias))


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """As :func:`linear_gelu_reference`; CUDA half-precision inputs take one cuBLASLt GEMM whose epilogue
    adds the bias and applies GELU to the float32 accumulator (``CUBLASLT_EPILOGUE_GELU_BIAS`` through
    ``torch._addmm_activation``), so the ``[..., N]`` pre-activation never goes to memory.

    That epilogue is GELU's tanh form (Hendrycks & Gimpel 2016, eq. 2), which differs from erf by at most
    4.7e-4 (at x = 2.70), a thirty-third of bf16's spacing there; with one rounding instead of two the fused
    result is closer to the exact float32 value than the reference's: on Whisper-medium's fc1 on an H200,
    mean |error| 9.3e-4 vs 1.27e-3, the same maximum (``benchmarks/diag_encoder.py``,
    ``benchmarks/results/diag_encoder_h200.json``). It saves 0.05 ms of 0.21 per 8-window fc1.

    ``x`` ``[..., K]`` -> ``[..., N]``, x's dtype.
    """
    if (FUSED_GELU_GEMM and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and x.dim() >= 2
            and weight.dtype == x.dtype and bias is not None and bias.dtype == x.dtype and _HAS_GELU_EPILOGUE):
        y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
        return y.view(*x.shape[:-1], weight.shape[0])
    return linear_gelu_reference(x, weight, bias)
