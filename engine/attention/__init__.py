"""Attention backends behind one small interface (see :class:`AttentionBackend`)."""

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.attention.torch_ref import TorchReferenceBackend

__all__ = ["AttentionBackend", "ForwardBatch", "TorchReferenceBackend", "make_backend"]


def make_backend(name: str, **kwargs) -> AttentionBackend:
    """Build a backend by name: ``"torch"`` (reference, CPU or GPU) or ``"triton"`` (CUDA only).

    Raises:
        ValueError: unknown name.
    """
    if name == "torch":
        return TorchReferenceBackend(**kwargs)
    if name == "triton":
        from engine.attention.triton_backend import TritonBackend

        return TritonBackend(**kwargs)
    raise ValueError(f"unknown attention backend {name!r} (expected 'torch' or 'triton')")
