"""An independent MOSS-TD reference assembled from ``transformers`` parts, and a checkpoint made from it.

Reference = ``WhisperFeatureExtractor`` (mel) + ``transformers``' ``WhisperEncoder`` + the adapter
(``nn.Sequential`` Linear, SiLU, Linear, LayerNorm) + ``Qwen3ForCausalLM``, following the released
processing: 30 s zero-padded windows, window ``i`` cut to ``4 * tokens_i`` frames, windows concatenated,
4 frames merged, adapter, embeddings scattered into the ``<|audio_pad|>`` positions, greedy decoding with
a KV cache. None of this imports the engine's model code; only the weights are shared, through a
safetensors directory with the checkpoint's names that the engine loads like a real one.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

AUDIO_ID = 151671
TEXT = {"vocab_size": 151_936, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 8192, "tie_word_embeddings": True}
AUDIO = {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128, "num_mel_bins": 80,
             "max_source_positions": 1500}


class Reference:
    """The transformers-based model. ``std``: N(0, std) for every weight (biases too, so a wrongly dropped
    bias shows), norms at 1 + N(0, std) (so a wrongly ignored norm weight shows)."""

    def __init__(self, seed: int = 0, std: float = 0.3) -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM, WhisperConfig, WhisperFeatureExtractor
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        torch.manual_seed(seed)
        self.fe = WhisperFeatureExtractor(feature_size=80)
        self.encoder = WhisperEncoder(WhisperConfig(**AUDIO)).eval()
        self.lm = Qwen3ForCausalLM(Qwen3Config(**TEXT, rope_parameters={"rope_type": "default",
                                                                         "rope_theta": 1e6})).eval()
        d, h = AUDIO["d_model"], TEXT["hidden_size"]
        self.adaptor = nn.Sequential(nn.Linear(4 * d, h), nn.SiLU(), nn.Linear(h, h),
                                     nn.LayerNorm(h, eps=TEXT["rms_norm_eps"])).eval()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in (self.encoder, self.lm, self.adaptor):
                for name, p in module.named_parameters():
                    is_norm = p.dim() == 1 and name.endswith("weight") and (
                        "norm" in name or name == "3.weight")
                    p.copy_((1.0 if is_norm else 0.0) + std * torch.randn(p.shape, generator=g))
        self.lm.tie_weights()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under the released checkpoint's names (``lm_head`` left out: it is tied)."""
        sd = {f"model.whisper_encoder.{k}": v for k, v in self.encoder.state_dict().items()}
        sd |= {f"model.vq_adaptor.layers.{k}": v for k, v in self.adaptor.state_dict().items()}
        sd |= {f"model.language_model.{k[len('model.'):]}": v for k, v in self.lm.state_dict().items()
               if k.startswith("model.")}
        return {k: v.contiguous().clone() for k, v in sd.items()}

    def write_checkpoint(self, path: Path, shards: int = 2, marker_every_s: int | None = None) -> Path:
        """A HF-style directory: config.json, sharded safetensors + index, tokenizer.json, and a
        processor_config.json when ``marker_every_s`` is given."""
        from safetensors.torch import save_file

        from engine.loaders.moss_td import ASSET_TOKENIZER

        path.mkdir(parents=True, exist_ok=True)
        sd = self.state_dict()
        names = sorted(sd)
        weight_map = {}
        for i in range(shards):
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: sd[n] for n in names[i::shards]}
            save_file(part, str(path / fname))
            weight_map |= {n: fname for n in part}
        index = {"metadata": {}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
        conf = {"model_type": "moss_transcribe_diarize", "audio_token_id": AUDIO_ID, "audio_merge_size": 4,
                "adaptor_input_dim": 4 * AUDIO["d_model"], "tie_word_embeddings": True,
                "text_config": {**TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                "audio_config": AUDIO}
        (path / "config.json").write_text(json.dumps(conf))
        (path / "tokenizer.json").write_bytes(ASSET_TOKENIZER.read_bytes())
        if marker_every_s is not None:
            proc = {"time_marker_every_seconds": marker_every_s}
            (path / "processor_config.json").write_text(json.dumps(proc))
        return path

    @torch.inference_mode()
    def audio_embeddings(self, wave: np.ndarray) -> torch.Tensor:
        """float32 ``[n]`` 16 kHz -> ``[N, hidden]``."""
        pieces = [wave[i : i + 480_000] for i in range(0, len(wave), 480_000)]
        feats = self.fe(pieces, sampling_rate=16_000, return_tensors="pt").input_features
        states = self.encoder(feats.float()).last_hidden_state
        frames = torch.cat([states[i, : 4 * ((len(p) - 1) // 1280 + 1)] for i, p in enumerate(pieces)])
        return self.adaptor(frames.reshape(-1, 4 * AUDIO["d_model"]))

    @torch.inference_mode()
    def greedy(self, prompt_ids: list[int], wave: np.ndarray,
               n_new: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy tokens and the float32 ``[vocab]`` logits of each step."""
        ids = torch.tensor([prompt_ids])
        emb = self.lm.get_input_embeddings()(ids)
        mask = (ids == AUDIO_ID)[..., None].expand_as(emb)
        emb = emb.masked_scatter(mask, self.audio_embeddings(wave).to(emb.dtype))
        # transformers 5.x names the KV cache argument ``cache`` (``past_key_values`` before)
        key = "cache" if "cache" in inspect.signature(self.lm.forward).parameters else "past_key_values"
        out = self.lm(inputs_embeds=emb, use_cache=True, logits_to_keep=1)
        tokens, logits = [], []
        for _ in range(n_new):
            step = out.logits[0, -1].float()
            tok = int(step.argmax())
            tokens.append(tok)
            logits.append(step)
            out = self.lm(input_ids=torch.tensor([[tok]]), use_cache=True, logits_to_keep=1,
                          **{key: getattr(out, key)})
        return tokens, logits


def make_audio(seconds: float, seed: int) -> np.ndarray:
    """Deterministic speech-like audio: gliding tones with an amplitude envelope plus noise (float32)."""
    n = int(seconds * 16_000)
    t = np.arange(n) / 16_000
    rng = np.random.default_rng(seed)
    f = 150 + 100 * np.sin(2 * np.pi * 0.3 * t + seed)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 16_000) * (0.6 + 0.4 * np.sin(2 * np.pi * 2.1 * t))
    return (x + 0.02 * rng.standard_normal(n)).astype(np.float32)
