"""Whisper encoder-decoder over our KV cache, with ``transformers`` parameter names.

Structure (Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision"; HF
``modeling_whisper.py`` names): encoder = conv1 (k3, s1) + GELU, conv2 (k3, s2) + GELU, learned/sinusoidal
positions (stored), pre-LN transformer layers, final LayerNorm; decoder = token + learned positions,
pre-LN layers of self-attention (KV pool), cross-attention (cross KV pool), MLP; final LayerNorm; logits
through the tied token embedding. k projections have no bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.kv import CrossKVPool


@dataclass
class WhisperConfig:
    """Shapes of a Whisper checkpoint (tiny.en: d_model 384, 6 heads, 4+4 layers, vocab 51864)."""

    d_model: int = 384
    encoder_layers: int = 4
    decoder_layers: int = 4
    encoder_attention_heads: int = 6
    decoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_ffn_dim: int = 1536
    num_mel_bins: int = 80
    vocab_size: int = 51864
    max_source_positions: int = 1500
    max_target_positions: int = 448

    @classmethod
    def from_dict(cls, d: dict) -> WhisperConfig:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @property
    def head_dim(self) -> int:
        return self.d_model // self.decoder_attention_heads


class _Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d // heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.heads, self.head_dim)


class WhisperEncoderLayer(nn.Module):
    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = _Attention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        q, k, v = (a.split(p(h)).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        x = x + a.out_proj(o)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperEncoder(nn.Module):
    """Mel ``[B, num_mel_bins, 3000]`` float -> hidden ``[B, 1500, d_model]``."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, cfg.d_model, 3, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, cfg.d_model)
        self.layers = nn.ModuleList(WhisperEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class WhisperDecoderLayer(nn.Module):
    def __init__(self, cfg: WhisperConfig, index: int) -> None:
        super().__init__()
        d = cfg.d_model
        self.index = index
        self.self_attn = _Attention(d, cfg.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = _Attention(d, cfg.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.decoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        o = attn.forward(self.index, a.split(a.q_proj(h)), a.split(a.k_proj(h)), a.split(a.v_proj(h)))
        x = x + a.out_proj(o.flatten(1))
        c = self.encoder_attn
        o = attn.cross_forward(self.index, c.split(c.q_proj(self.encoder_attn_layer_norm(x))))
        x = x + c.out_proj(o.flatten(1))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperDecoder(nn.Module):
    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_positions = nn.Embedding(cfg.max_target_positions, cfg.d_model)
        self.layers = nn.ModuleList(WhisperDecoderLayer(cfg, i) for i in range(cfg.decoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids) + self.embed_positions(batch.positions)
        for layer in self.layers:
            x = layer(x, attn)
        return self.layer_norm(x)


class _WhisperModel(nn.Module):
    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(cfg)
        self.decoder = WhisperDecoder(cfg)


class WhisperForConditionalGeneration(nn.Module):
    """Whisper for our engine. Parameter names equal ``transformers.WhisperForConditionalGeneration``."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = _WhisperModel(cfg)
        self.proj_out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.proj_out.weight = self.model.decoder.embed_tokens.weight

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """Mel ``[B, 80, 3000]`` -> encoder states ``[B, 1500, d_model]``."""
        return self.model.encoder(mel)

    @torch.inference_mode()
    def write_cross_kv(self, enc: torch.Tensor, rows: torch.Tensor, cross: CrossKVPool) -> None:
        """Project encoder states ``[B, 1500, d]`` to each decoder layer's cross K/V, stored at ``rows`` ``[B]``."""
        for i, layer in enumerate(self.model.decoder.layers):
            c = layer.encoder_attn
            cross.k[i][rows] = c.split(c.k_proj(enc)).to(cross.k[i].dtype)
            cross.v[i][rows] = c.split(c.v_proj(enc)).to(cross.v[i].dtype)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Run the decoder on the step's packed tokens; return logits ``[B, vocab]`` (float32) at
        ``batch.logits_indices``."""
        h = self.model.decoder(batch, attn)
        return self.proj_out(h[batch.logits_indices]).float()

    # -- engine hooks ------------------------------------------------------------------------------
    def kv_layout(self) -> tuple[int, int, int]:
        """(layers, kv heads, head_dim) of the self-attention KV pool."""
        c = self.config
        return c.decoder_layers, c.decoder_attention_heads, c.head_dim

    def cross_layout(self) -> tuple[int, int, int, int]:
        """(layers, source_len, heads, head_dim) of the cross-attention KV rows."""
        c = self.config
        return c.decoder_layers, c.max_source_positions, c.decoder_attention_heads, c.head_dim

    @property
    def max_context(self) -> int:
        return self.config.max_target_positions

    @torch.inference_mode()
    def prepare(self, seqs: list, cross: CrossKVPool) -> None:
        """Encode the admitted sequences' windows in one batch and write their cross KV.

        Each sequence carries ``mm_inputs["mel"]`` (float32 ``[80, 3000]``). With
        ``mm_inputs["keep_encoder"]`` the encoder states (``[1500, d]``) stay in ``mm_state["encoder"]``
        for word alignment after the KV is freed.
        """
        dev, dtype = self.proj_out.weight.device, self.proj_out.weight.dtype
        mel = torch.stack([s.mm_inputs.pop("mel") for s in seqs]).to(dev, dtype)
        enc = self.encode(mel)
        self.write_cross_kv(enc, torch.tensor([s.row for s in seqs], device=dev), cross)
        for i, s in enumerate(seqs):
            if s.mm_inputs.get("keep_encoder"):
                s.mm_state["encoder"] = enc[i]
