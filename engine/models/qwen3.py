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
import torch.nn.functional as F
from torch import nn

from engine.attention.base import AttentionBackend, ForwardBatch


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


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``, computed in float32 and cast back (as HF Qwen3RMSNorm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin float32 ``[T, head_dim]`` for int64 positions ``[T]`` (frequencies repeated twice)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device)
                                .float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, H, D]`` by cos/sin ``[T, D]`` ("rotate half" layout); returns x's dtype."""
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * c + rotated * s


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config, index: int) -> None:
        super().__init__()
        self.index = index
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.hq * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rotary(self.q_norm(self.q_proj(x).view(t, self.hq, self.d)), cos, sin)
        k = apply_rotary(self.k_norm(self.k_proj(x).view(t, self.hkv, self.d)), cos, sin)
        v = self.v_proj(x).view(t, self.hkv, self.d)
        return self.o_proj(attn.forward(self.index, q, k, v).reshape(t, self.hq * self.d))


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, index: int) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg, index)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    """Embedding, layers and final norm (HF ``Qwen3Model``; MOSS-TD keeps it at ``model.language_model``)."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        """Token embeddings ``[T, hidden]``; ``batch.input_embeds`` replaces them where ``embeds_mask``."""
        x = self.embed_tokens(batch.input_ids)
        if batch.input_embeds is not None and batch.embeds_mask is not None:
            x = torch.where(batch.embeds_mask[:, None], batch.input_embeds.to(x.dtype), x)
        return x

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` of the step's packed tokens (KV written through ``attn``)."""
        c = self.config
        cos, sin = rotary_cos_sin(batch.positions, c.head_dim, c.rope_theta)
        x = self.embed(batch)
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        return self.norm(x)


class Qwen3ForCausalLM(nn.Module):
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
        return self.lm_head(h[batch.logits_indices]).float()

    def kv_layout(self) -> tuple[int, int, int]:
        c = self.config
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim

    def cross_layout(self) -> None:
        return None

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    def prepare(self, seqs: list, cross: object) -> None:
        """Nothing to encode: a text-only model."""
