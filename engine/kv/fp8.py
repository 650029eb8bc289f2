"""FP8 (e4m3) KV cache: the quantisation rule, written once, that the torch reference and the kernels follow.

Scales are per token and KV head: each new token's K (and, separately, V) of one head, ``head_dim`` values,
is divided by ``scale = amax / 448`` (448: the largest finite e4m3 value, OCP "8-bit Floating Point
Specification (OFP8)", 2023, the ``E4M3FN`` variant torch calls ``float8_e4m3fn``) and rounded to nearest,
ties to even. Why per token-head rather than per block or per tensor:

- a token's scale is fixed when it is stored, so nothing is ever re-quantised (a block's scale would have
  to grow as later tokens arrive, or be calibrated ahead of time, which a new checkpoint does not have);
- the store kernel already holds the whole head row (RMSNorm'd and rotated K, or V) in registers, so the
  amax costs one reduction there and no second pass over memory;
- outliers stay local: one loud token or head does not flatten the resolution of every other one.

The price is one float32 per (token, head) for K and one for V: 4 bytes next to ``head_dim`` codes, 3% at
``head_dim`` 128, so one token takes ``(128 + 4) / 256`` of its bf16 bytes (1.94x the tokens per byte).

Attention never materialises the dequantised cache: a key's scale multiplies its score (``q . k_code``
times ``k_scale``), a value's scale multiplies its softmax weight before the ``p . V`` product.
"""

from __future__ import annotations

import torch

from engine.config import KV_DTYPES

E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` value; codes are clamped to +-this (no NaN from an overflow)."""

FP8_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.float32


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantisation of ``x`` ``[..., D]`` (any float dtype) along its last axis.

    Returns:
        codes ``float8_e4m3fn`` ``[..., D]`` and scales float32 ``[...]`` with ``x ~= codes * scale``;
        a row of zeros gets scale 1 and zero codes. Rounding: nearest, ties to even (torch's cast).
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    codes = (xf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return codes, scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``codes * scale[..., None]`` for codes ``[..., D]`` and scales ``[...]``."""
    return codes.float() * scale[..., None].float()


def kv_storage_dtype(kv_dtype: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype the self-attention KV pool stores for an ``EngineConfig.kv_dtype`` value:
    ``"auto"`` -> the compute dtype, ``"fp8_e4m3"`` -> ``float8_e4m3fn``.

    Raises:
        ValueError: any other value.
    """
    if kv_dtype == "auto":
        return compute_dtype
    if kv_dtype == "fp8_e4m3":
        return FP8_DTYPE
    raise ValueError(f"unknown kv_dtype {kv_dtype!r} (expected one of {', '.join(KV_DTYPES)})")
