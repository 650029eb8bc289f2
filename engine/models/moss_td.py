"""MOSS-Transcribe-Diarize: Whisper-medium encoder, 4-frame merge, adapter, Qwen3 decoder.

Checkpoint layout (OpenMOSS ``MossTranscribeDiarizeForConditionalGeneration`` and the
released ``config.json``): ``model.whisper_encoder.*`` (HF ``WhisperEncoder`` names),
``model.vq_adaptor.layers.{0,2,3}.*`` (Linear, SiLU, Linear, LayerNorm with the text ``rms_norm_eps``),
``model.language_model.*`` (HF ``Qwen3Model`` names), ``lm_head.weight`` tied to the token embedding.

Audio path of one recording: 30 s windows (the last zero-padded) -> log-mel ``[80, 3000]`` each -> encoder
``[1500, d]`` each -> keep the first ``4 * tokens(window)`` frames of each window -> concatenate along time
-> merge 4 consecutive frames (``[T, d] -> [T/4, 4d]``) -> adapter -> ``[N, hidden]``, one row per
``<|audio_pad|>`` of the prompt, written into those positions in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.base import AttentionBackend, ForwardBatch
from engine.models.mel import CHUNK_SAMPLES, log_mel_spectrogram
from engine.models.moss_td_prompt import window_token_counts
from engine.models.qwen3 import Qwen3Config, Qwen3Model
from engine.models.shape_checks import check_positive
from engine.models.whisper import WhisperConfig, WhisperEncoder
from engine.ops.linear import UsesLinearKernels, linear

AUDIO_TOKEN_ID = 151671
OFFICIAL_CONTEXT = 131_072
"""Positions the official code allows: the processor's ``max_length`` (OpenMOSS ``prepare_inputs``) refuses
longer prompts, and nothing else bounds them (1-D RoPE has no position table, so a config's smaller
``max_position_embeddings``, e.g. the code default 40,960, limits nothing there). Our KV table is sized to it
and it bounds prompt + output here (the official ``generate`` could decode past it)."""


def whisper_medium_encoder_config() -> WhisperConfig:
    """The MOSS-TD audio encoder: Whisper-medium (24 layers, d 1024, 16 heads, FFN 4096, 1500 positions)."""
    return WhisperConfig(d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096,
                         num_mel_bins=80, max_source_positions=1500)


@dataclass
class MossTDConfig:
    """Shapes of a MOSS-TD checkpoint (defaults: the released 0.91 B model with a 131,072-token context).

    ``encoder_batch``: windows per encoder forward (microbatches bound activation memory on long audio).
    """

    text: Qwen3Config = field(default_factory=lambda: Qwen3Config(max_position_embeddings=131_072))
    audio: WhisperConfig = field(default_factory=whisper_medium_encoder_config)
    audio_token_id: int = AUDIO_TOKEN_ID
    audio_merge_size: int = 4
    encoder_batch: int = 8

    @classmethod
    def from_dict(cls, d: dict) -> MossTDConfig:
        """From the checkpoint's ``config.json`` (``text_config``, ``audio_config``, top-level ids)."""
        base = cls()
        text = {**base.text.__dict__, **d.get("text_config", {})}
        if "tie_word_embeddings" in d:
            text["tie_word_embeddings"] = d["tie_word_embeddings"]
        audio = {**base.audio.__dict__, **d.get("audio_config", {})}
        out = cls(text=Qwen3Config.from_dict(text), audio=WhisperConfig.from_dict(audio),
                  audio_token_id=int(d.get("audio_token_id", AUDIO_TOKEN_ID)),
                  audio_merge_size=int(d.get("audio_merge_size", 4)),
                  encoder_batch=int(d.get("encoder_batch", base.encoder_batch)))
        dim = d.get("adaptor_input_dim")
        if dim is not None and dim != out.audio.d_model * out.audio_merge_size:
            raise ValueError(
                f"adaptor_input_dim {dim} != d_model {out.audio.d_model} x merge {out.audio_merge_size}")
        return out

    def check(self) -> None:
        """Refuse shapes no model can be built from: the decoder's (``text_config``), the audio encoder's
        (``audio_config``, its decoder fields unused), or a merge size or encoder batch that is not positive.
        Field names as ``config.json`` nests them. ``audio_token_id`` is not checked against the vocabulary: tiny
        test shapes shrink the vocabulary below it and run, the audio positions' rows coming from the encoder.

        Raises:
            ValueError: naming the first field out of range (:mod:`engine.models.shape_checks`).
        """
        self.text.check("text_config.")
        self.audio.check("audio_config.", decoder=False)
        check_positive(self, ("audio_merge_size", "encoder_batch"))


class VQAdaptor(nn.Module):
    """``layers`` = Linear(4d -> hidden), SiLU, Linear(hidden -> hidden), LayerNorm(hidden, eps)."""

    def __init__(self, in_dim: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(in_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                                    nn.LayerNorm(hidden, eps=eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _MossTDModel(nn.Module):
    def __init__(self, cfg: MossTDConfig) -> None:
        super().__init__()
        self.whisper_encoder = WhisperEncoder(cfg.audio)
        self.vq_adaptor = VQAdaptor(cfg.audio.d_model * cfg.audio_merge_size, cfg.text.hidden_size,
                                    cfg.text.rms_norm_eps)
        self.language_model = Qwen3Model(cfg.text)


class MossTDForConditionalGeneration(nn.Module, UsesLinearKernels):
    """MOSS-TD for our engine; parameter names equal the released checkpoint's."""

    def __init__(self, cfg: MossTDConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = _MossTDModel(cfg)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)
        if cfg.text.tie_word_embeddings:
            self.lm_head.weight = self.model.language_model.embed_tokens.weight
        # The checkpoint's generation rules (engine.logits_rules.GreedyLogitsRules), installed by the engine
        # once its req_to_token rows exist; applied inside forward, so eager steps and every graph see them.
        self.logits_rules = None

    # -- audio -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode_windows(self, windows: torch.Tensor) -> torch.Tensor:
        """16 kHz windows float32 ``[W, <=480000]`` -> encoder states ``[W, 1500, d]`` (model dtype),
        ``encoder_batch`` windows per forward."""
        outs = []
        for i in range(0, windows.shape[0], self.config.encoder_batch):
            mel = self.window_mel(windows[i : i + self.config.encoder_batch].to(self.lm_head.weight.device))
            outs.append(self.model.whisper_encoder(mel))
        return torch.cat(outs)

    # Hooks of the engine's encoder stage (engine/encoder_manager.py), which batches windows across requests.
    @property
    def audio_encoder(self) -> nn.Module:
        """The Whisper encoder: mel ``[W, n_mels, 3000]`` (model dtype) -> states ``[W, 1500, d]``."""
        return self.model.whisper_encoder

    def window_mel(self, windows: torch.Tensor) -> torch.Tensor:
        """16 kHz windows float32 ``[W, <=480000]`` (on the model's device) -> log-mel ``[W, n_mels, 3000]``
        in the model dtype."""
        mel = log_mel_spectrogram(windows, self.config.audio.num_mel_bins)
        return mel.to(self.lm_head.weight.dtype)

    def merge_and_adapt(self, states: torch.Tensor, token_counts: list[int]) -> torch.Tensor:
        """Encoder states of one recording's windows ``[W, 1500, d]`` -> audio embeddings ``[N, hidden]``
        with ``N = sum(token_counts)``: cut window ``i`` to ``4 * token_counts[i]`` frames, concatenate,
        merge 4 frames, adapter."""
        if not token_counts:
            return self.lm_head.weight.new_zeros(0, self.config.text.hidden_size)
        m = self.config.audio_merge_size
        x = torch.cat([states[i, : m * n] for i, n in enumerate(token_counts)])
        t = x.shape[0] // m
        return self.model.vq_adaptor(x[: t * m].reshape(t, m * x.shape[-1]))

    @torch.inference_mode()
    def audio_embeddings(self, waves: list[torch.Tensor]) -> list[torch.Tensor]:
        """Recordings (float32 ``[n]`` 16 kHz each) -> audio embeddings ``[N_i, hidden]`` each, with
        ``N_i = sum(window_token_counts(n_i))``. Windows of all recordings share encoder forwards."""
        windows, spans, total = [], [], 0
        for wave in waves:
            counts = window_token_counts(int(wave.numel()))
            spans.append((total, counts))
            total += len(counts)
            if counts:  # zero-pad the last window, then view the recording as [W, 480000]
                padded = F.pad(wave.float(), (0, len(counts) * CHUNK_SAMPLES - wave.numel()))
                windows.append(padded.view(len(counts), CHUNK_SAMPLES))
        if not windows:
            return [self.lm_head.weight.new_zeros(0, self.config.text.hidden_size) for _ in waves]
        states = self.encode_windows(torch.cat(windows))
        return [self.merge_and_adapt(states[lo : lo + len(c)], c) for lo, c in spans]

    # -- engine hooks ------------------------------------------------------------------------------
    @torch.inference_mode()
    def prepare(self, seqs: list, cross: object = None) -> None:
        """Encode the admitted sequences' audio (``mm_inputs["audio"]``, float32 ``[n]`` 16 kHz) and set
        ``mm_state["embed_fn"]`` so the runner writes the embeddings into the ``<|audio_pad|>`` positions.

        Raises:
            ValueError: the prompt's ``<|audio_pad|>`` count differs from the audio's token count.
        """
        if self.logits_rules is not None:  # a new owner of a row starts with no history
            self.logits_rules.reset([s.row for s in seqs if s.row is not None])
        todo = [s for s in seqs if "audio" in s.mm_inputs]
        waves = [torch.as_tensor(s.mm_inputs.pop("audio")).flatten() for s in todo]
        for seq, emb in zip(todo, self.audio_embeddings(waves), strict=True):
            self.attach_audio(seq, emb)

    def attach_audio(self, seq, emb: torch.Tensor) -> None:
        """Set ``seq.mm_state["embed_fn"]`` to serve ``emb`` ``[N, hidden]`` at the prompt's ``<|audio_pad|>``
        positions, in order.

        Raises:
            ValueError: the prompt's ``<|audio_pad|>`` count differs from ``N``.
        """
        ids = torch.tensor(seq.prompt_ids, dtype=torch.int64)
        is_audio = ids == self.config.audio_token_id
        if int(is_audio.sum()) != emb.shape[0]:
            raise ValueError(
                f"prompt has {int(is_audio.sum())} <|audio_pad|> tokens, audio gives {emb.shape[0]}")
        # non_blocking: a blocking host-to-device copy would wait for the decode step in flight
        index = torch.where(is_audio, torch.cumsum(is_audio, 0) - 1, -1).to(emb.device, non_blocking=True)
        seq.mm_state["embed_fn"] = _EmbedSource(seq, emb, index)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Logits float32 ``[B, vocab]`` at ``batch.logits_indices`` after the checkpoint's generation rules
        (``logits_rules``: repetition penalty, suppressed ids); audio embeddings come in through
        ``batch.input_embeds`` / ``batch.embeds_mask``."""
        h = self.model.language_model(batch, attn)
        logits = linear(h[batch.logits_indices], self.lm_head.weight, self.linear_kernels).float()
        return logits if self.logits_rules is None else self.logits_rules(batch, logits)

    def kv_layout(self) -> tuple[int, int, int]:
        """(layers, kv heads, head_dim) of the decoder's KV pool (0.91 B: 28, 8, 128 = 112 KiB/token bf16)."""
        t = self.config.text
        return t.num_hidden_layers, t.num_key_value_heads, t.head_dim

    def cross_layout(self) -> None:
        """Decoder-only: no cross-attention KV."""
        return

    @property
    def max_context(self) -> int:
        """:data:`OFFICIAL_CONTEXT` (131,072), whatever the config's ``max_position_embeddings`` says."""
        return OFFICIAL_CONTEXT

    @property
    def hidden_size(self) -> int:
        return self.config.text.hidden_size

    def fuse_projections(self) -> None:
        """Pack the decoder's q/k/v and gate/up weights (:meth:`Qwen3Model.fuse_projections`) and the audio
        encoder's q/k/v (:meth:`WhisperEncoder.fuse_projections`)."""
        self.model.language_model.fuse_projections()
        self.model.whisper_encoder.fuse_projections()


class _EmbedSource:
    """The runner's ``embed_fn(start, n) -> (embeds [n, hidden], mask bool [n])`` for one sequence.

    Drops its tensors (and itself from ``mm_state``) once the prompt's last position has been served, so a
    long recording's embeddings do not outlive its prefill.
    """

    def __init__(self, seq, embeds: torch.Tensor, index: torch.Tensor) -> None:
        self.seq, self.embeds, self.index = seq, embeds, index

    def __call__(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.index[start : start + n]
        mask = idx >= 0
        out = self.embeds[idx.clamp(min=0)]
        if start + n >= self.index.numel():
            self.seq.mm_state.pop("embed_fn", None)
            self.embeds = self.index = None
        return out, mask
