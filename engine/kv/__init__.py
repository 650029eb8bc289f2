"""Token-indexed KV cache: flat per-layer K/V pools, a free-slot allocator and the req_to_token table."""

from engine.kv.allocator import SlotAllocator
from engine.kv.pool import CrossKVPool, KVDestination, KVPool
from engine.kv.table import ReqToTokenTable

__all__ = ["CrossKVPool", "KVDestination", "KVPool", "ReqToTokenTable", "SlotAllocator"]
