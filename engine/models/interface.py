"""What the engine needs from a model, as Protocols: the one place the model contract is written.

Every model the loaders build (:mod:`engine.models.whisper`, :mod:`engine.models.qwen3`,
:mod:`engine.models.moss_td`) satisfies :class:`EngineModel`; models whose audio enters the prompt as
embeddings (MOSS-TD) also satisfy :class:`AudioPromptModel`, which turns on the engine's encoder stage
(:class:`engine.encoder_manager.EncoderManager`). The engine checks these types, never attribute names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from engine.attention.base import AttentionBackend, ForwardBatch
    from engine.kv import CrossKVPool
    from engine.request import Sequence


@runtime_checkable
class EngineModel(Protocol):
    """A decoder the engine can batch (an ``nn.Module``: the engine also reads its parameters' dtype).

    Invariants: :meth:`__call__` reads the step's tokens from ``batch`` and attention only through
    ``attn`` (so the same model runs eagerly and inside CUDA graphs); it writes nothing but the KV the
    backend stores.
    """

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt plus output) the model's positions allow, in tokens."""
        ...

    @property
    def hidden_size(self) -> int:
        """Width of the decoder's hidden states and token embeddings (static prefill-graph inputs)."""
        ...

    def kv_layout(self) -> tuple[int, int, int]:
        """``(layers, kv heads, head_dim)`` of the self-attention KV pool."""
        ...

    def cross_layout(self) -> tuple[int, int, int, int] | None:
        """``(layers, source_len, heads, head_dim)`` of per-row cross-attention KV (encoder-decoder
        models), or ``None`` for decoder-only models."""
        ...

    def prepare(self, seqs: list[Sequence], cross: CrossKVPool | None) -> None:
        """Before a step, encode what the newly admitted ``seqs`` carry in ``mm_inputs`` (their first
        prefill chunk is in this step)."""
        ...

    def __call__(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Float32 logits ``[B, vocab]`` at ``batch.logits_indices``."""
        ...


@runtime_checkable
class AudioPromptModel(EngineModel, Protocol):
    """A model whose audio is encoded in 30 s windows and spliced into the prompt as embeddings.

    The encoder stage batches windows of many requests through :meth:`window_mel` and
    :attr:`audio_encoder`, then hands each request its embeddings with :meth:`merge_and_adapt` and
    :meth:`attach_audio`.
    """

    @property
    def audio_encoder(self) -> nn.Module:
        """Log-mel ``[W, n_mels, 3000]`` -> encoder states ``[W, 1500, d]`` (captured in graphs)."""
        ...

    def window_mel(self, windows: torch.Tensor) -> torch.Tensor:
        """16 kHz windows float32 ``[W, 480000]`` -> log-mel ``[W, n_mels, 3000]`` in the model's dtype."""
        ...

    def merge_and_adapt(self, states: torch.Tensor, token_counts: list[int]) -> torch.Tensor:
        """One request's encoder states ``[W, 1500, d]`` -> prompt embeddings ``[sum(token_counts), hidden]``;
        no windows give ``[0, hidden]`` of the model's dtype."""
        ...

    def attach_audio(self, seq: Sequence, emb: torch.Tensor) -> None:
        """Make ``emb`` the embeddings of ``seq``'s audio positions.

        Raises:
            ValueError: the prompt's audio positions and ``emb`` differ in count.
        """
        ...
