"""Qwen3 decoder over our token-indexed KV cache, with ``transformers`` parameter names.

Structure (Qwen team 2025, "Qwen3 Technical Report"; HF ``modeling_qwen3.py`` names): token embedding,
pre-norm layers of grouped-query self-attention (per-head RMSNorm on q and k before rotary embeddings,
no bias) and a SwiGLU MLP, a final RMSNorm, logits through ``lm_head`` (tied to the embedding when
``tie_word_embeddings``). Rotary embeddings use the "rotate half" layout with 1-D positions
(Su et al. 2021, "RoFormer"); the inverse frequencies are ``theta ** (-2i / head_dim)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.models.fused_weights import Fusable as _Fusable
from engine.models.fused_weights import fuse_linears
from engine.models.shape_checks import check_divides, check_positive
from engine.ops import add_rms_norm, qk_norm_rope, rms_norm, silu_and_mul
from engine.ops.linear import UsesLinearKernels, add_rms_norm_linear, add_rms_norm_swiglu_mlp, linear
from engine.ops.norm import pre_rms_norm
from engine.ops.rotary import RotaryTable, apply_rotary, rotary_cos_sin

__all__ = ["Qwen3Config", "Qwen3ForCausalLM", "Qwen3Model", "apply_rotary", "rotary_cos_sin"]


@dataclass
class Qwen3Config:
    """Decoder shapes. Defaults are Qwen3-0.6B (the MOSS-TD decoder): 28 layers, hidden 1024,
    16 query / 8 KV heads of 128, SwiGLU 3072, vocab 151,936, RoPE theta 1e6, eps 1e-6."""

    vocab_size: int = 151_936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40_960
    tie_word_embeddings: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> Qwen3Config:
        """From an HF ``text_config`` dict; accepts ``rope_theta`` at the top level (transformers 4) or in
        ``rope_parameters`` (transformers 5). Raises ValueError for RoPE scaling we do not implement."""
        d = dict(d)
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if "rope_theta" not in d and "rope_theta" in rope:
            d["rope_theta"] = rope["rope_theta"]
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ValueError(f"unsupported RoPE type {kind!r} (only plain 1-D RoPE)")
        if d.get("head_dim") is None and "hidden_size" in d and "num_attention_heads" in d:
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if d.get(k) is not None})

    def check(self, where: str = "") -> None:
        """Refuse shapes no decoder can be built from: a size, ``rms_norm_eps`` or ``rope_theta`` that is not
        positive, query heads that the KV heads do not divide (grouped-query attention), or an odd
        ``head_dim`` (rotate-half RoPE pairs its halves). ``where`` prefixes the names (``text_config.``).

        Raises:
            ValueError: naming the first field out of range (:mod:`engine.models.shape_checks`).
        """
        check_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                              "rope_theta", "max_position_embeddings"), where)
        check_divides(self, "num_key_value_heads", "num_attention_heads", where)
        if self.head_dim % 2:
            raise ValueError(f"field '{where}head_dim' must be even (rotate-half RoPE), got {self.head_dim}")


class RMSNorm(nn.Module):
    """Holds the RMSNorm weight ``[dim]`` under HF's name; the math is :func:`engine.ops.rms_norm`
    (float32 statistics, cast back, times the weight, as HF ``Qwen3RMSNorm``)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Qwen3Attention(_Fusable, UsesLinearKernels):
    _fused_name = "qkv_weight"

    def __init__(self, cfg: Qwen3Config, index: int, rope: RotaryTable) -> None:
        super().__init__()
        self.index = index
        self.rope = rope
        self.eps = cfg.rms_norm_eps
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.hq * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.qkv_weight: torch.Tensor | None = None  # [(Hq + 2 Hkv) * D, hidden] once fused

    def fuse_projections(self) -> None:
        self.qkv_weight = fuse_linears([self.q_proj, self.k_proj, self.v_proj])[0]

    def project(self, x: torch.Tensor, residual: torch.Tensor | None,
                norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input norm and q/k/v projection: ``(qkv [T, (Hq + 2 Hkv) D], next residual)``; see
        :func:`engine.ops.linear.add_rms_norm_linear` (one kernel at batch-1 decode when fused)."""
        if self.qkv_weight is not None:
            return add_rms_norm_linear(x, residual, norm.weight, norm.eps, self.qkv_weight, self.linear_kernels)
        h, residual = pre_rms_norm(x, residual, norm.weight, norm.eps)
        return torch.cat((self.q_proj(h), self.k_proj(h), self.v_proj(h)), dim=-1), residual

    def attend(self, qkv: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        """q/k RMSNorm + rotary (K/V stored to the pool), attention, ``o_proj``: ``[T, hidden]``."""
        dest = attn.kv_destination(self.index)
        q, k, v = qk_norm_rope(qkv, positions, self.rope, self.q_norm.weight, self.k_norm.weight,
                               self.hq, self.hkv, self.eps, kv_dest=dest)
        out = attn.forward(self.index, q, k, v, kv_stored=dest is not None)
        return linear(out.reshape(qkv.shape[0], self.hq * self.d), self.o_proj.weight, self.linear_kernels)


class Qwen3MLP(_Fusable, UsesLinearKernels):
    _fused_name = "gate_up_weight"

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_weight: torch.Tensor | None = None  # [2 * intermediate, hidden] once fused

    def fuse_projections(self) -> None:
        self.gate_up_weight = fuse_linears([self.gate_proj, self.up_proj])[0]

    def forward(self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """The post-attention add + ``norm``, gate/up, SwiGLU and down: ``(out [T, hidden], next residual)``
        (:func:`engine.ops.linear.add_rms_norm_swiglu_mlp`: two kernels at batch-1 decode when fused)."""
        if self.gate_up_weight is not None:
            return add_rms_norm_swiglu_mlp(x, residual, norm.weight, norm.eps, self.gate_up_weight,
                                           self.down_proj.weight, self.linear_kernels)
        h, residual = pre_rms_norm(x, residual, norm.weight, norm.eps)
        gate_up = torch.cat((self.gate_proj(h), self.up_proj(h)), dim=-1)
        return linear(silu_and_mul(gate_up), self.down_proj.weight, self.linear_kernels), residual


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, index: int, rope: RotaryTable) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg, index, rope)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)``. The residual stream is added at the next norm (fused add + norm),
        which rounds exactly as HF's ``x = x + block(norm(x))``; with ``LinearKernels.fused_norm_gemv`` a
        batch-1 step also folds each add + norm into the q/k/v or gate/up GEMV, and SwiGLU into the gate/up
        GEMV's epilogue."""
        qkv, residual = self.self_attn.project(x, residual, self.input_layernorm)
        h = self.self_attn.attend(qkv, positions, attn)
        return self.mlp(h, residual, self.post_attention_layernorm)


class Qwen3Model(nn.Module):
    """Embedding, layers and final norm (HF ``Qwen3Model``; MOSS-TD keeps it at ``model.language_model``)."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        self.rope = RotaryTable(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg, i, self.rope)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def fuse_projections(self) -> None:
        """Pack q/k/v and gate/up weights into one matrix each: one GEMM instead of three or two (decode
        GEMVs are bandwidth-bound and small ones leave the GPU idle). Call once the model has its final
        device and weights (``Module.to`` and friends re-fuse after converting; a later in-place weight load
        through the HF names writes into the fused matrix, since those parameters are its views)."""
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        """Token embeddings ``[T, hidden]``; ``batch.input_embeds`` replaces them where ``embeds_mask``."""
        x = self.embed_tokens(batch.input_ids)
        if batch.input_embeds is not None and batch.embeds_mask is not None:
            x = torch.where(batch.embeds_mask[:, None], batch.input_embeds.to(x.dtype), x)
        return x

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` of the step's packed tokens (KV written through ``attn``)."""
        x, residual = self.embed(batch), None
        for layer in self.layers:
            x, residual = layer(x, residual, batch.positions, attn)
        return add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]


class Qwen3ForCausalLM(nn.Module, UsesLinearKernels):
    """A plain Qwen3 language model for our engine (``model.*``, ``lm_head``), used to test the decoder on
    its own against ``transformers.Qwen3ForCausalLM``. Engine hooks as in :mod:`engine.models.whisper`."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Logits float32 ``[B, vocab]`` at ``batch.logits_indices``."""
        h = self.model(batch, attn)
        return linear(h[batch.logits_indices], self.lm_head.weight, self.linear_kernels).float()

    def kv_layout(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim

    def cross_layout(self) -> None:
        return None

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def fuse_projections(self) -> None:
        """See :meth:`Qwen3Model.fuse_projections`."""
        self.model.fuse_projections()

    def prepare(self, seqs: list, cross: object) -> None:
        """Nothing to encode: a text-only model."""
