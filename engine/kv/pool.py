"""Flat KV buffers: one K and one V tensor per layer, indexed by slot (page size 1)."""

from __future__ import annotations

import torch


class KVPool:
    """Self-attention KV cache.

    ``k[layer]`` and ``v[layer]``: ``[num_slots + 1, num_kv_heads, head_dim]`` in ``dtype`` on ``device``.
    Slot 0 is the dummy slot (padded rows of a CUDA graph write there); real slots are ``1..num_slots``.
    """

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shape = (num_slots + 1, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V bytes of one token over all layers (e.g. Qwen3-0.6B bf16: 28*2*8*128*2 = 114,688 = 112 KiB)."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' K/V (``[T, num_kv_heads, head_dim]``) to ``slots`` (int64 ``[T]``)."""
        self.k[layer][slots] = k.to(self.k[layer].dtype)
        self.v[layer][slots] = v.to(self.v[layer].dtype)


class CrossKVPool:
    """Whisper cross-attention KV, written once per request at prefill and read-only afterwards.

    ``k[layer]`` and ``v[layer]``: ``[max_reqs + 1, source_len, num_heads, head_dim]``, indexed by the
    sequence's ``req_to_token`` row (row 0 is the padding dummy). ``source_len`` is 1500 for Whisper.
    """

    def __init__(self, num_layers: int, max_reqs: int, source_len: int, num_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (max_reqs + 1, source_len, num_heads, head_dim)
        self.source_len = source_len
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_row(num_layers: int, source_len: int, num_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of one request row over all layers (tiny.en fp32: 4*2*1500*6*64*4 = 18.4 MB)."""
        return 2 * num_layers * source_len * num_heads * head_dim * torch.empty((), dtype=dtype).element_size()
