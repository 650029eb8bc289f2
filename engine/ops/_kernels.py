"""The Triton kernel module, imported on first CUDA use (CPU processes never import Triton, and the kernel
tests can set ``TRITON_INTERPRET`` before the kernels are decorated)."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def kernels() -> ModuleType:
    """:mod:`engine.ops.triton_kernels`, imported once."""
    from engine.ops import triton_kernels

    return triton_kernels
