"""The Triton kernel module, imported on first CUDA use (CPU processes never import Triton, and the kernel
tests can set ``TRITON_INTERPRET`` before the kernels are decorated)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType


@functools.cache
def kernels() -> ModuleType:
    """:mod:`engine.ops.triton_kernels`, imported once."""
    from engine.ops import triton_kernels

    return triton_kernels


@functools.cache
def rope_kernel() -> Callable:
    """:func:`engine.ops.triton_rope.qk_norm_rope`, imported once."""
    from engine.ops.triton_rope import qk_norm_rope

    return qk_norm_rope


@functools.cache
def fused_kernels() -> ModuleType:
    """:mod:`engine.ops.triton_fused` (the GEMVs with a norm or SwiGLU prologue), imported once."""
    from engine.ops import triton_fused

    return triton_fused
