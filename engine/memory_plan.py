"""The memory plan: how many bytes the KV cache gets, and how they split into pools, rows and slots.

Sized once, when the engine is built, after the weights have loaded (so CUDA's free memory already excludes
them) and before anything else takes device memory (graphs, loop buffers):

1. the budget (:func:`kv_budget_bytes`): ``EngineConfig.kv_budget_bytes`` when set, else
   ``kv_memory_fraction`` of the CUDA memory free now, else (CPU, meta) :data:`CPU_KV_BUDGET`;
2. models with cross-attention (Whisper) take one :class:`~engine.kv.CrossKVPool` row per running request
   first, with ``max_running_requests`` lowered until every row still leaves one full context of
   self-attention KV;
3. the rest becomes self-attention slots (one slot holds one token of every layer's K and V, in
   ``EngineConfig.kv_dtype``: FP8 codes and their scales take 0.52 of bf16's bytes, so the same budget holds
   1.94x the tokens), at most ``max_reqs * max_context`` of them: more could never be used at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from engine.kv import CrossKVPool, KVPool, ReqToTokenTable, SlotAllocator
from engine.kv.fp8 import kv_storage_dtype

if TYPE_CHECKING:
    from engine.models.interface import EngineModel

GiB = 1 << 30
CPU_KV_BUDGET = 1 * GiB
"""KV bytes on a device that reports no free memory (CPU, meta) when the config sets no budget."""


@dataclass
class MemoryPlan:
    """The engine's KV memory, allocated.

    Attributes:
        kv: self-attention K/V for ``allocator.num_slots`` tokens (slot 0 is the allocator's padding slot).
        allocator: hands out the pool's slots, a whole reservation at admission.
        table: ``req_to_token`` rows (one per running request) mapping positions to slots.
        cross: Whisper's cross-attention K/V, one row per running request; ``None`` for decoder-only models.
        max_reqs: requests that can run at once (``max_running_requests``, lowered to what the cross rows
            and one full context each leave room for).
        kv_bytes_per_token: bytes one self-attention slot takes (all layers, K and V).
    """

    kv: KVPool
    allocator: SlotAllocator
    table: ReqToTokenTable
    cross: CrossKVPool | None
    max_reqs: int
    kv_bytes_per_token: int


def kv_budget_bytes(cfg: EngineConfig, device: torch.device) -> int:
    """Bytes for the whole KV cache (self-attention plus cross-attention rows); step 1 of the module
    docstring. On CUDA this reads the free memory now, so call it after the weights have loaded."""
    if cfg.kv_budget_bytes is not None:
        return int(cfg.kv_budget_bytes)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * cfg.kv_memory_fraction)
    return CPU_KV_BUDGET


def plan_memory(model: EngineModel, cfg: EngineConfig, max_context: int, dtype: torch.dtype,
                device: torch.device) -> MemoryPlan:
    """Size and allocate the KV pools for ``model`` (module docstring, steps 1-3).

    Raises:
        ValueError: the budget holds no single token of self-attention KV.
    """
    budget = kv_budget_bytes(cfg, device)
    layers, kv_heads, head_dim = model.kv_layout()
    kv_dtype = kv_storage_dtype(cfg.kv_dtype, dtype)
    per_token = KVPool.bytes_per_token(layers, kv_heads, head_dim, kv_dtype)
    max_reqs = cfg.max_running_requests
    cross = None
    cross_layout = model.cross_layout()
    if cross_layout is not None:
        per_row = CrossKVPool.bytes_per_row(*cross_layout, dtype)
        # Leave at least one full context per row for self-attention KV.
        max_reqs = max(1, min(max_reqs, budget // (per_row + per_token * max_context)))
        budget -= per_row * max_reqs
        cl, src, heads, hd = cross_layout
        cross = CrossKVPool(cl, max_reqs, src, heads, hd, dtype, device)
    slots = min(budget // per_token, max_reqs * max_context)
    if slots < 1:
        raise ValueError(f"KV budget of {budget} bytes holds no token ({per_token} bytes per token)")
    return MemoryPlan(kv=KVPool(layers, int(slots), kv_heads, head_dim, kv_dtype, device),
                      allocator=SlotAllocator(int(slots)), table=ReqToTokenTable(max_reqs, max_context, device),
                      cross=cross, max_reqs=max_reqs, kv_bytes_per_token=per_token)
