"""Triton attention kernels over the token-indexed KV cache (GPU; also run under ``TRITON_INTERPRET=1``).

- :func:`decode_attention`: one query per sequence, split-KV over the context (two stages), GQA.
- :func:`extend_attention`: several new queries per sequence over its cached prefix and themselves,
  bottom-right causal (prefill chunks), or over a fixed-length source without a mask (cross-attention).

Both read K/V either through the ``req_to_token`` table (self-attention) or directly at
``row * src_len + pos`` in a ``[rows * src_len, H, D]`` view (Whisper cross-attention).
"""

from engine.attention.triton_ops.decode import (
    DecodeTile,
    decode_attention,
    decode_splits_for_fill,
    decode_tile,
)
from engine.attention.triton_ops.extend import extend_attention, extend_tile

__all__ = ["DecodeTile", "decode_attention", "decode_splits_for_fill", "decode_tile", "extend_attention", "extend_tile"]
