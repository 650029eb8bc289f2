"""The attention-backend interface and the per-step batch description it consumes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from engine.kv import CrossKVPool, KVDestination, KVPool, ReqToTokenTable

if TYPE_CHECKING:
    from engine.config import EngineConfig


@dataclass
class ForwardBatch:
    """One engine step: new tokens of several sequences packed along one token axis (T tokens, B sequences).

    Sequence ``i`` contributes ``extend_lens[i]`` new tokens at packed offsets ``qo_indptr[i]:qo_indptr[i+1]``;
    the first ``prefix_lens[i]`` positions of its row are already in the KV cache, so its queries sit at
    absolute positions ``prefix_lens[i] .. seq_lens[i]-1`` and use bottom-right causal masking. A decode
    step is the case ``extend_lens[i] == 1``; a chunk of a long prompt is the case ``prefix_lens[i] > 0``
    with ``extend_lens[i] > 1``.

    Attributes:
        input_ids: int64 ``[T]``.
        positions: int64 ``[T]`` absolute positions (RoPE / learned position index).
        out_cache_loc: int64 ``[T]`` KV slot of each new token.
        req_rows: int64 ``[B]`` ``req_to_token`` rows.
        prefix_lens, extend_lens, seq_lens: int64 ``[B]`` on the host (tokens).
        qo_indptr: int64 ``[B + 1]`` on the host, cumulative ``extend_lens``.
        logits_indices: int64 ``[B]`` packed index of each sequence's last new token.
        input_embeds: optional float ``[T, hidden]`` that replaces the token embedding where
            ``embeds_mask`` (bool ``[T]``) is set (MOSS-TD audio positions).
        token_rows: optional int64 ``[T]`` on the device, the ``req_to_token`` row of each token (0 for graph
            padding); read by the checkpoint's logits rules (:mod:`engine.logits_rules`).
        num_decode_prefix: the first ``num_decode_prefix`` items decode an output token (one new token
            each, token ``i`` is item ``i``, no input embeddings); the scheduler puts decodes first, so a
            mixed step can run them as a decode graph and the rest as a prefill graph.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    logits_indices: torch.Tensor
    input_embeds: torch.Tensor | None = None
    embeds_mask: torch.Tensor | None = None
    num_decode_prefix: int = 0
    token_rows: torch.Tensor | None = None

    def split(self, k: int) -> tuple[ForwardBatch, ForwardBatch]:
        """Items ``:k`` and ``k:`` as two batches; the first ``k`` items must have one new token each and no
        input embeddings (``num_decode_prefix >= k``). Token tensors are views; the second batch's
        ``logits_indices`` are rebased on the device."""
        if not 0 < k < self.batch_size or k > self.num_decode_prefix:
            raise ValueError(f"cannot split {self.batch_size} items at {k} ({self.num_decode_prefix} decodes)")
        head = ForwardBatch(
            input_ids=self.input_ids[:k], positions=self.positions[:k], out_cache_loc=self.out_cache_loc[:k],
            req_rows=self.req_rows[:k], prefix_lens=self.prefix_lens[:k], extend_lens=self.extend_lens[:k],
            seq_lens=self.seq_lens[:k], qo_indptr=self.qo_indptr[: k + 1],
            logits_indices=self.logits_indices[:k], num_decode_prefix=k,
            token_rows=None if self.token_rows is None else self.token_rows[:k],
        )
        tail = ForwardBatch(
            input_ids=self.input_ids[k:], positions=self.positions[k:], out_cache_loc=self.out_cache_loc[k:],
            req_rows=self.req_rows[k:], prefix_lens=self.prefix_lens[k:], extend_lens=self.extend_lens[k:],
            seq_lens=self.seq_lens[k:], qo_indptr=self.qo_indptr[k:] - k, logits_indices=self.logits_indices[k:] - k,
            input_embeds=None if self.input_embeds is None else self.input_embeds[k:],
            embeds_mask=None if self.embeds_mask is None else self.embeds_mask[k:],
            token_rows=None if self.token_rows is None else self.token_rows[k:],
        )
        return head, tail

    @property
    def batch_size(self) -> int:
        return int(self.req_rows.numel())

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def is_decode_only(self) -> bool:
        return bool((self.extend_lens == 1).all())


class AttentionBackend(ABC):
    """What a model layer needs from attention. One instance serves every layer of one engine.

    Life cycle per step: ``prepare(batch)`` once, then ``forward`` (and ``cross_forward`` for
    encoder-decoder models) once per layer. A backend that can run inside CUDA graphs also satisfies
    :class:`GraphCapableBackend`.
    """

    def __init__(self, kv: KVPool, table: ReqToTokenTable, cross: CrossKVPool | None = None,
                 sm_scale: float | None = None) -> None:
        self.kv = kv
        self.table = table
        self.cross = cross
        self.sm_scale = sm_scale

    @classmethod
    def config_options(cls, config: EngineConfig) -> dict[str, Any]:
        """Constructor keywords this backend takes from the engine configuration (its tuning knobs);
        none by default."""
        return {}

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Build attention metadata for ``batch`` (called once per step before the layers run)."""

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                kv_stored: bool = False) -> torch.Tensor:
        """Store the new tokens' K/V in the pool (unless ``kv_stored``), then attend.

        Args:
            q: ``[T, num_q_heads, head_dim]``; k, v: ``[T, num_kv_heads, head_dim]`` (GQA when fewer heads).
            kv_stored: a fused kernel already wrote this step's K/V to :meth:`kv_destination`; k and v
                may then be None.
        Returns:
            ``[T, num_q_heads, head_dim]`` in q's dtype.
        """

    def kv_destination(self, layer: int) -> KVDestination | None:
        """Where a model's fused kernel may write this step's new K/V itself (buffers, int64 slots ``[T]``,
        and the FP8 scales when the pool is quantised). ``None`` (the default): pass K/V to
        :meth:`forward`, which stores them."""
        return None

    def cross_forward(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Encoder-decoder attention of ``q`` (``[T, H, D]``) over the sequence's cross KV (no mask)."""
        raise NotImplementedError("this backend has no cross-attention")


@runtime_checkable
class GraphCapableBackend(Protocol):
    """What CUDA-graph capture and replay need from an attention backend (:mod:`engine.cuda_graph`,
    :mod:`engine.prefill_graphs`): metadata kept in static buffers that captured kernels point at.

    After ``prepare_for_capture`` / ``prepare_prefill_capture`` the backend's ``meta.loc`` is the static
    int64 slot buffer of the step's new tokens (the graphs' ``out_cache_loc``); the ``prepare_*_replay``
    hooks only copy into those buffers, never reallocate them.
    """

    def init_graph_capture(self, max_batch_size: int) -> None:
        """Allocate static metadata buffers for decode graphs up to ``max_batch_size``."""
        ...

    def prepare_for_capture(self, batch_size: int) -> None:
        """Point metadata at the static buffers for a capture at ``batch_size`` (padded rows use row 0)."""
        ...

    def prepare_for_replay(self, batch: ForwardBatch, padded_batch_size: int) -> None:
        """Copy ``batch``'s metadata into the static buffers before a replay at ``padded_batch_size``."""
        ...

    def init_prefill_capture(self, max_tokens: int, max_items: int) -> None:
        """Allocate static metadata for prefill graphs (extend items only) of up to ``max_tokens`` new
        tokens in up to ``max_items`` items."""
        ...

    def prepare_prefill_capture(self, tokens: int) -> None:
        """Point metadata at the static buffers for a prefill capture of ``tokens`` (padded) tokens."""
        ...

    def prepare_prefill_replay(self, batch: ForwardBatch, tokens: int) -> None:
        """Copy ``batch``'s metadata into the static buffers before a prefill replay padded to ``tokens``."""
        ...
