"""Triton kernels on a machine without CUDA: under the interpreter (``TRITON_INTERPRET=1``, numpy on the CPU),
which runs the very same kernel source, so the indexing, masking and reduction logic is tested there too.

Triton reads the variable when a kernel is decorated, i.e. when its module is first imported: a kernel test
imports this module before any kernel module (an ``# isort: split`` line after the import keeps it first)
and then calls :func:`skip_unless_interpreted` with one of its kernels. Importing this module skips the
importing test module where triton is not installed.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
"""The kernels run compiled on the GPU when true, under the interpreter otherwise."""
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed (it ships with Linux torch wheels)")
DEV = torch.device("cuda" if CUDA else "cpu")
"""Where the kernel tests put their tensors."""


def skip_unless_interpreted(kernel: object) -> None:
    """Without CUDA, skip the calling test module (at import) when ``kernel``, a ``@triton.jit`` function, was
    decorated for compiling: its module was imported before this one set ``TRITON_INTERPRET``, and it could
    not run on the CPU. With CUDA, nothing."""
    if CUDA:
        return
    from triton.runtime import interpreter

    if not isinstance(kernel, interpreter.InterpretedFunction):
        pytest.skip("kernels were imported before TRITON_INTERPRET was set", allow_module_level=True)
