"""Diarist's inference engine: continuous batching over a token-indexed KV cache.

Imports nothing from ``api``, ``worker`` or ``diarist``; usable on its own::

    from engine import Engine, EngineConfig
"""

from engine.config import EngineConfig
from engine.engine import Engine
from engine.request import FinishReason, RequestRejected, Sequence

__all__ = ["Engine", "EngineConfig", "FinishReason", "RequestRejected", "Sequence"]
