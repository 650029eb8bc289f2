"""Linear layers of the decoder: our Triton GEMV for one-token steps, cuBLAS otherwise.

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
