"""Flat KV buffers: one K and one V tensor per layer, indexed by slot (page size 1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv import fp8


@dataclass
class KVDestination:
    """Where a fused kernel writes one layer's new K/V itself (:meth:`AttentionBackend.kv_destination`).

    Attributes:
        k, v: the layer's pool buffers ``[num_slots + 1, num_kv_heads, head_dim]``.
        slots: int64 ``[T]`` slot of each new token.
        k_scale, v_scale: float32 ``[num_slots + 1, num_kv_heads]`` when the pool stores FP8 codes
            (:mod:`engine.kv.fp8`), else ``None``.
    """

    k: torch.Tensor
    v: torch.Tensor
    slots: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``, ``v`` ``[T, num_kv_heads, head_dim]`` at :attr:`slots` (quantising for FP8): the
        torch path that the fused kernels match."""
        if self.k_scale is None:
            self.k[self.slots] = k.to(self.k.dtype)
            self.v[self.slots] = v.to(self.v.dtype)
            return
        kc, ks = fp8.quantize(k)
        vc, vs = fp8.quantize(v)
        # through uint8 views: torch has no CPU index kernels for float8 (the bytes are the same)
        self.k.view(torch.uint8)[self.slots], self.k_scale[self.slots] = kc.view(torch.uint8), ks
        self.v.view(torch.uint8)[self.slots], self.v_scale[self.slots] = vc.view(torch.uint8), vs


class KVPool:
    """Self-attention KV cache.

    ``k[layer]`` and ``v[layer]``: ``[num_slots + 1, num_kv_heads, head_dim]`` in ``dtype`` on ``device``.
    Slot 0 is the dummy slot (padded rows of a CUDA graph write there); real slots are ``1..num_slots``.
    With ``dtype=torch.float8_e4m3fn`` the buffers hold e4m3 codes and ``k_scale[layer]`` /
    ``v_scale[layer]`` (float32 ``[num_slots + 1, num_kv_heads]``) their per token-head scales
    (:mod:`engine.kv.fp8`); otherwise the scale lists are empty.
    """

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.quantized = dtype == fp8.FP8_DTYPE
        shape = (num_slots + 1, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        n_scales = num_layers if self.quantized else 0
        self.k_scale = [torch.ones(shape[:2], dtype=fp8.SCALE_DTYPE, device=device) for _ in range(n_scales)]
        self.v_scale = [torch.ones(shape[:2], dtype=fp8.SCALE_DTYPE, device=device) for _ in range(n_scales)]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V bytes of one token over all layers, scales included (e.g. Qwen3-0.6B bf16:
        28*2*8*128*2 = 114,688 = 112 KiB; FP8: 28*2*8*(128 + 4) = 59,136)."""
        per_head = head_dim * torch.empty((), dtype=dtype).element_size()
        if dtype == fp8.FP8_DTYPE:
            per_head += torch.empty((), dtype=fp8.SCALE_DTYPE).element_size()
        return 2 * num_layers * num_kv_heads * per_head

    def destination(self, layer: int, slots: torch.Tensor) -> KVDestination:
        """Layer ``layer``'s buffers (and scales) for new tokens at ``slots`` (int64 ``[T]``)."""
        if self.quantized:
            return KVDestination(self.k[layer], self.v[layer], slots, self.k_scale[layer], self.v_scale[layer])
        return KVDestination(self.k[layer], self.v[layer], slots)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' K/V (``[T, num_kv_heads, head_dim]``) to ``slots`` (int64 ``[T]``),
        quantised per token-head when the pool is FP8."""
        self.destination(layer, slots).store(k, v)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots`` (int64, any shape ``[...]``): ``[..., num_kv_heads, head_dim]`` in the pool's
        dtype, or dequantised to float32 when it is FP8 (the reference backend's view of the cache)."""
        if not self.quantized:
            return self.k[layer][slots], self.v[layer][slots]
        def codes(buf: torch.Tensor) -> torch.Tensor:  # gathered as bytes: no CPU index kernel for float8
            return buf.view(torch.uint8)[slots].view(fp8.FP8_DTYPE)

        return (fp8.dequantize(codes(self.k[layer]), self.k_scale[layer][slots]),
                fp8.dequantize(codes(self.v[layer]), self.v_scale[layer][slots]))


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
