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
from engine.models.fused_weights import Fusable, fuse_linears
from engine.models.shape_checks import check_divides, check_positive
from engine.ops import add_layer_norm, layer_norm, linear_gelu
from engine.ops.linear import UsesLinearKernels


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

    def check(self, where: str = "", decoder: bool = True) -> None:
        """Refuse shapes no model can be built from: a size that is not positive, or ``d_model`` that a
        head count does not divide. ``decoder=False`` checks the encoder alone (MOSS-TD's audio encoder,
        whose decoder fields are unused); ``where`` prefixes the field names (``audio_config.``).

        Raises:
            ValueError: naming the first field out of range (:mod:`engine.models.shape_checks`).
        """
        encoder = ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "num_mel_bins",
                   "max_source_positions")
        decoders = ("decoder_layers", "decoder_attention_heads", "decoder_ffn_dim", "vocab_size",
                    "max_target_positions")
        check_positive(self, encoder + decoders if decoder else encoder, where)
        for heads in ("encoder_attention_heads", "decoder_attention_heads") if decoder else ("encoder_attention_heads",):
            check_divides(self, heads, "d_model", where)


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


class WhisperEncoderLayer(Fusable, UsesLinearKernels):
    """One pre-LN encoder layer, in the deferred-residual form of :class:`Qwen3DecoderLayer`.

    The layer computes HF's ``x = x + attn(ln1(x)); x = x + mlp(ln2(x))`` with every residual add fused into
    the LayerNorm that follows it (:func:`engine.ops.add_layer_norm`, which rounds the sum as the unfused
    add): it takes the stream as ``residual + x`` and returns ``(mlp_out, residual)``, whose sum is the stream
    after the layer; the next layer's (or the final) LayerNorm adds them.

    After :meth:`fuse_projections` q/k/v are one GEMM and SDPA reads them as views of its output.
    """

    _fused_name = "qkv_weight"

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = _Attention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.qkv_weight: torch.Tensor | None = None  # [3d, d] once fused
        self.qkv_bias: torch.Tensor | None = None  # [3d], zeros in k's rows (k_proj has no bias)

    def fuse_projections(self) -> None:
        """Pack q/k/v into ``qkv_weight`` / ``qkv_bias``; the HF-named parameters become their views."""
        a = self.self_attn
        self.qkv_weight, self.qkv_bias = fuse_linears([a.q_proj, a.k_proj, a.v_proj])

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        """Self-attention with the output projection: normed ``h`` ``[B, S, d]`` -> ``[B, S, d]``.

        q/k/v reach SDPA as ``[B, H, S, D]`` views of ``[B, S, H, D]`` memory (fused: of the packed
        ``[B, S, 3, H, D]`` GEMM output), layouts cuDNN's SDPA takes as they are (torch's
        ``check_cudnn_layout``: "unpacked" / "packed QKV") and flash/efficient take with unit last stride;
        each backend writes its output in ``[B, S, H, D]`` memory, so the head merge below is a view.
        """
        a = self.self_attn
        b, n, d = h.shape
        if self.qkv_weight is not None:
            qkv = F.linear(h, self.qkv_weight, self.qkv_bias).view(b, n, 3, a.heads, a.head_dim)
            q, k, v = qkv.unbind(2)
        else:
            q, k, v = (a.split(p(h)) for p in (a.q_proj, a.k_proj, a.v_proj))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return a.out_proj(o.transpose(1, 2).reshape(b, n, d))

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[B, S, d]``: the previous layer's MLP output, or the stream itself when ``residual`` is
        None. Returns ``(mlp_out, residual)``, both ``[B, S, d]`` contiguous."""
        ln1, ln2 = self.self_attn_layer_norm, self.final_layer_norm
        if residual is None:
            h, residual = layer_norm(x, ln1.weight, ln1.bias, ln1.eps), x
        else:
            h, residual = add_layer_norm(x, residual, ln1.weight, ln1.bias, ln1.eps)
        h, residual = add_layer_norm(self.attention(h), residual, ln2.weight, ln2.bias, ln2.eps)
        return self.fc2(linear_gelu(h, self.fc1.weight, self.fc1.bias, self.linear_kernels)), residual


def conv_front_channels_last(mel: torch.Tensor, conv1: nn.Conv1d, conv2: nn.Conv1d) -> torch.Tensor:
    """``gelu(conv2(gelu(conv1(mel))))`` as 2-D convs over ``[B, C, 1, L]`` in channels-last memory.

    cuDNN's convolution kernels are NHWC; given NCHW tensors it transposes the input and the output around
    each conv (``nchwToNhwc`` / ``nhwcToNchw``: ~0.18 ms per 8 windows of Whisper-medium on an H200). Here
    only the small mel is transposed, and the result ``[B, d, L']`` lies in ``[B, L', d]`` memory, so its
    transpose (the residual stream) is contiguous without a copy.

    Args: mel ``[B, n_mels, L]``; the two ``Conv1d`` (any stride/padding, no dilation or groups).
    Returns: ``[B, d, L']`` with strides ``(L' * d, 1, d)``.
    """
    x = mel.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    for conv in (conv1, conv2):
        x = F.gelu(F.conv2d(x, conv.weight.unsqueeze(2), conv.bias, stride=(1, conv.stride[0]),
                            padding=(0, conv.padding[0])))
    return x.squeeze(2)


class WhisperEncoder(nn.Module):
    """Mel ``[B, num_mel_bins, 3000]`` float -> hidden ``[B, 1500, d_model]``."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, cfg.d_model, 3, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, cfg.d_model)
        self.layers = nn.ModuleList(WhisperEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def fuse_projections(self) -> None:
        """Pack each layer's q/k/v weights (:meth:`WhisperEncoderLayer.fuse_projections`). Call once the
        weights are loaded and on their device and dtype (``Module.to`` re-fuses after converting)."""
        for layer in self.layers:
            layer.fuse_projections()

    def embed(self, mel: torch.Tensor) -> torch.Tensor:
        """Conv front end and positions: mel ``[B, n_mels, 3000]`` -> ``[B, 1500, d]``, contiguous.

        The conv output is ``[B, d, 1500]``; its transpose plus the positions is the residual stream, which
        must be contiguous: a transposed stream (HF's ``x + pos`` keeps the first operand's layout) made every
        LayerNorm copy it and every residual add run strided (3.6 ms of copies per 8-window forward of
        Whisper-medium on an H200). On CUDA the convs write ``[B, 1500, d]`` memory already
        (:func:`conv_front_channels_last`); elsewhere adding the positions first lays the sum out
        contiguously (TensorIterator follows the first operand whose strides decide). Same sum either way.
        """
        if mel.is_cuda:
            x = conv_front_channels_last(mel, self.conv1, self.conv2)
        else:
            x = F.gelu(self.conv2(F.gelu(self.conv1(mel))))
        return self.embed_positions.weight[: x.shape[2]] + x.transpose(1, 2)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """Mel ``[B, n_mels, 3000]`` (model dtype) -> states ``[B, 1500, d]``, contiguous; the last layer's
        residual add is fused into the final LayerNorm."""
        x, residual = self.embed(mel), None
        for layer in self.layers:
            x, residual = layer(x, residual)
        ln = self.layer_norm
        if residual is None:  # no layers
            return layer_norm(x, ln.weight, ln.bias, ln.eps)
        return add_layer_norm(x, residual, ln.weight, ln.bias, ln.eps)[0]


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

    def fuse_projections(self) -> None:
        """Pack the encoder's q/k/v weights (:meth:`WhisperEncoder.fuse_projections`); the decoder keeps its
        separate projections (its self-attention writes k/v to the KV pool one token at a time)."""
        self.model.encoder.fuse_projections()

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

    @property
    def hidden_size(self) -> int:
        return self.config.d_model

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
