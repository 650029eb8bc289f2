"""SwiGLU's gate (Shazeer 2020, "GLU Variants Improve Transformer"): ``silu(gate) * up``.

Rounding follows ``transformers``' ``Qwen3MLP``: ``silu`` of the gate is rounded to the dtype, then
multiplied by ``up`` in that dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops._kernels import kernels


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[T, 2I]`` = ``[gate | up]``; returns ``[T, I]``, same dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """As :func:`silu_and_mul_reference`; one Triton kernel for CUDA tensors (no ``[T, I]`` temporaries).

    Raises ValueError if the last dim is odd.
    """
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim must be even, got {gate_up.shape[-1]}")
    if gate_up.is_cuda and gate_up.dim() == 2:
        return kernels().silu_and_mul(gate_up)
    return silu_and_mul_reference(gate_up)
