"""Attention backends behind one small interface (see :class:`AttentionBackend`), by name.

``BACKENDS`` is the one list of names (``EngineConfig.attention_backend``); a backend that can run inside
CUDA graphs satisfies :class:`GraphCapableBackend`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.attention.base import AttentionBackend, ForwardBatch, GraphCapableBackend
from engine.attention.torch_ref import TorchReferenceBackend

if TYPE_CHECKING:
    from engine.config import EngineConfig

__all__ = ["BACKENDS", "AttentionBackend", "ForwardBatch", "GraphCapableBackend", "TorchReferenceBackend",
           "backend_class", "make_backend", "supports_cuda_graphs"]

BACKENDS = ("torch", "triton")
"""``torch``: the reference (any device, the test oracle); ``triton``: the CUDA kernels."""


def backend_class(name: str) -> type[AttentionBackend]:
    """The backend class called ``name`` (the Triton one is imported on first use).

    Raises:
        ValueError: a name not in ``BACKENDS``.
    """
    if name == "torch":
        return TorchReferenceBackend
    if name == "triton":
        from engine.attention.triton_backend import TritonBackend

        return TritonBackend
    raise ValueError(f"unknown attention backend {name!r} (expected one of {', '.join(BACKENDS)})")


def supports_cuda_graphs(name: str) -> bool:
    """Whether the backend called ``name`` can be captured in CUDA graphs (:class:`GraphCapableBackend`).

    Raises:
        ValueError: a name not in ``BACKENDS``.
    """
    return issubclass(backend_class(name), GraphCapableBackend)


def make_backend(name: str, config: EngineConfig | None = None, **kwargs: Any) -> AttentionBackend:
    """Build the backend called ``name`` with ``kwargs`` (``kv``, ``table``, ``cross``, ...) and the tuning
    it takes from ``config`` (:meth:`AttentionBackend.config_options`).

    Raises:
        ValueError: a name not in ``BACKENDS``.
    """
    cls = backend_class(name)
    return cls(**kwargs, **(cls.config_options(config) if config is not None else {}))
