"""Diarist's inference engine: continuous batching over a token-indexed KV cache.

Imports nothing from ``api``, ``worker``, ``diarist`` or ``transcription``; usable on its own::

    from engine import Engine, EngineConfig

``EngineConfig`` and ``DeviceUnavailable`` import without torch; ``Engine`` and the request types load it
on first use.
"""

from engine.config import DeviceUnavailable, EngineConfig

__all__ = ["DeviceUnavailable", "Engine", "EngineConfig", "FinishReason", "RequestRejected", "Sequence"]


def __getattr__(name: str):
    if name == "Engine":
        from engine.engine import Engine

        return Engine
    if name in ("FinishReason", "RequestRejected", "Sequence"):
        from engine import request

        return getattr(request, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
