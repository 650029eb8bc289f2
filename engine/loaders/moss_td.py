"""Load MOSS-Transcribe-Diarize from a local Hugging Face directory, or with random (dummy) weights.

HF directory: ``config.json`` (``text_config``, ``audio_config``, ``audio_token_id``, ...), weights in
``*.safetensors`` (one file, or shards listed by ``model.safetensors.index.json``), ``tokenizer.json``,
optionally ``generation_config.json`` (EOS ids, repetition penalty, suppressed ids, output budget:
:mod:`engine.generation_config`; fields we do not implement are refused) and ``processor_config.json`` /
``preprocessor_config.json`` (time-marker interval). Parameter names must be exactly the model's
(683 tensors for the released checkpoint; ``lm_head.weight`` may be absent when tied).

Dummy: any shape (default: the full 0.91 B model); ``EngineConfig.dummy_config`` is a ``config.json``-like
dict (``text_config``/``audio_config`` overrides, plus ``init_std``), the tokenizer comes from
``engine/assets/qwen3`` (see its NOTICE.md).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from engine.config import EngineConfig
from engine.generation_config import read_generation_config
from engine.loaders.base import LoadedModel, torch_dtype
from engine.loaders.ct2 import CheckpointError
from engine.models.moss_td import MossTDConfig, MossTDForConditionalGeneration
from engine.models.moss_td_prompt import DEFAULT_MARKER_EVERY_S, read_chat_template, read_marker_interval
from engine.models.qwen3 import Qwen3Config
from engine.models.shape_checks import check_positive, scalar_fields
from engine.models.whisper import WhisperConfig
from engine.tokenizer import TextTokenizer

log = logging.getLogger("diarist.engine")

ASSET_TOKENIZER = Path(__file__).resolve().parents[1] / "assets" / "qwen3" / "moss_td_tokenizer.json"
EOS_ID = 151645
NO_CHECKPOINT = (
    "moss-td needs its checkpoint: pass --model-path DIR (DIARIST_MODEL_PATH) with the released Hugging Face "
    "folder; random weights only with an explicit --load-format dummy (DIARIST_LOAD_FORMAT=dummy), whose "
    "transcripts are noise")

# A tiny MOSS-TD for CPU runs of ``--load-format dummy`` (CI, smoke tests): real vocabulary, tokenizer,
# prompt and audio path; 2 encoder layers of d 64, 2 decoder layers of hidden 64 (10 M parameters).
TINY_DUMMY_CONFIG = {
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
    "audio_config": {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128},
    "init_std": 0.5,  # std 0.02 gives near-uniform logits; 0.5 gives varied (random) text
}


DEFAULT_INIT_STD = 0.02
"""Standard deviation of the random weights when ``dummy_config`` sets no ``init_std``."""

TOP_LEVEL_FIELDS = {"tie_word_embeddings": bool, "adaptor_input_dim": int, "init_std": float}
"""Top-level ``config.json`` keys MOSS-TD reads besides ``MossTDConfig``'s own scalar fields:
``tie_word_embeddings`` and ``adaptor_input_dim`` (``MossTDConfig.from_dict``) and ``init_std`` (the random
initialisation's standard deviation, :func:`load_moss_td`)."""


def dummy_schema() -> dict[str, Any]:
    """``{field: type}`` of MOSS-TD's ``dummy_config``: the ``config.json`` layout ``MossTDConfig.from_dict``
    reads (``text_config``: :class:`Qwen3Config` fields, ``audio_config``: :class:`WhisperConfig` fields, the
    top-level scalars of ``MossTDConfig``) and :data:`TOP_LEVEL_FIELDS`."""
    return {"text_config": scalar_fields(Qwen3Config), "audio_config": scalar_fields(WhisperConfig),
            **scalar_fields(MossTDConfig), **TOP_LEVEL_FIELDS}


def check_dummy(conf: dict[str, Any]) -> None:
    """Refuse MOSS-TD ``dummy_config`` values that build no model: those :meth:`MossTDConfig.check` refuses
    (and ``from_dict``'s ``adaptor_input_dim`` rule), or an ``init_std`` that is not positive (ValueError)."""
    MossTDConfig.from_dict(conf).check()
    check_positive(SimpleNamespace(init_std=conf.get("init_std", DEFAULT_INIT_STD)), ("init_std",))


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{path}: shards listed in the index are missing: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    return files


def _copy_weights(model: MossTDForConditionalGeneration, path: Path) -> None:
    """Copy each checkpoint tensor into its parameter (one tensor in host memory at a time)."""
    from safetensors import safe_open

    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.config.text.tie_word_embeddings
    seen, unexpected = set(), []
    for f in _weight_files(path):
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118 - safe_open has keys(), it is not iterable
                if name == "lm_head.weight" and tied:
                    continue
                p = params.get(name)
                if p is None:
                    unexpected.append(name)
                    continue
                t = sf.get_tensor(name)
                if tuple(t.shape) != tuple(p.shape):
                    raise CheckpointError(
                        f"{path}: {name} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
                with torch.no_grad():
                    p.copy_(t)
                seen.add(name)
    missing = [n for n in params if n not in seen and not (tied and n == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"{path}: missing {len(missing)} tensors {missing[:5]}, "
                              f"unexpected {len(unexpected)} {unexpected[:5]}")


def _init_random(model: MossTDForConditionalGeneration, seed: int, std: float, device: torch.device) -> None:
    """N(0, std) matrices and embeddings, zero biases, unit norm weights (1-D ``weight`` tensors)."""
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=g)


# The audio frontend our mel implements (engine/models/mel.py): WhisperFeatureExtractor's settings.
FEATURE_EXTRACTOR = {"sampling_rate": 16_000, "hop_length": 160, "n_fft": 400, "chunk_length": 30,
                     "n_samples": 480_000, "nb_max_frames": 3000}


def check_feature_extractor(path: Path | None, num_mel_bins: int) -> None:
    """Refuse a folder whose ``preprocessor_config.json`` (or the ``feature_extractor`` entry of
    ``processor_config.json``) states a frontend
    other than ours: the mel would not be the one the weights were trained on. Absent keys are not checked.

    Raises:
        CheckpointError: a stated value differs (the message names the key and both values).
    """
    for name in ("preprocessor_config.json", "processor_config.json"):
        p = path / name if path is not None else None
        if p is None or not p.is_file():
            continue
        data = json.loads(p.read_text())
        fe = data.get("feature_extractor")  # a processor config nests its feature extractor's
        fe = fe if isinstance(fe, dict) else (data if name == "preprocessor_config.json" else {})
        want = {**FEATURE_EXTRACTOR, "feature_size": num_mel_bins}
        bad = [f"{k}={fe[k]!r} (ours {v!r})" for k, v in want.items() if k in fe and fe[k] != v]
        if fe.get("dither") not in (None, 0, 0.0):
            bad.append(f"dither={fe['dither']!r} (ours 0)")
        if bad:
            raise CheckpointError(f"{p}: the feature extractor differs from the engine's Whisper frontend: "
                                  f"{', '.join(bad)}")


MARKER_INTERVAL_ASSUMED = "marker_interval_assumed"
"""Result warning code: the checkpoint folder states no time-marker interval, so the processor code's
default was assumed (every result of such an engine carries it; the message names the value)."""


def marker_assumed_warning(path: Path, interval_s: int) -> dict[str, str]:
    """The :data:`MARKER_INTERVAL_ASSUMED` warning (``{"code", "message"}``) for the folder ``path``."""
    return {"code": MARKER_INTERVAL_ASSUMED,
            "message": f"the checkpoint folder {path.name!r} has no processor_config.json stating "
                       f"time_marker_every_seconds; time markers every {interval_s} s (the processor code's "
                       f"default) were assumed. A model trained with another interval reads every timestamp "
                       f"wrong: the released checkpoint states its own (docs/moss_td.md); put the file in the "
                       f"folder or set DIARIST_MOSS_MARKER_INTERVAL_S"}


def resolve_marker_interval(path: Path | None, setting: int | None) -> tuple[int, str]:
    """The time-marker interval (seconds) and where it came from: ``setting`` (``EngineConfig.
    marker_interval_s`` / ``DIARIST_MOSS_MARKER_INTERVAL_S``) wins, else the folder's processor config,
    else the processor code's default (:data:`DEFAULT_MARKER_EVERY_S`), with a warning at load (and, from
    :func:`load_moss_td`, in every result: :func:`marker_assumed_warning`): a model trained with another
    interval reads every timestamp wrong, and nothing else would show it.

    Raises:
        CheckpointError: a negative ``setting``.
    """
    stated = read_marker_interval(path)
    if setting is not None:
        if int(setting) < 0:
            raise CheckpointError(f"marker interval must be >= 0 seconds (0: no markers), not {setting}")
        if stated is not None and stated[0] != int(setting):
            log.warning("MOSS-TD time markers every %d s (the setting), although %s in %s says %d s",
                        int(setting), stated[1], path, stated[0])
        return int(setting), "setting"
    if stated is not None:
        return stated
    if path is not None:  # (random weights have no trained interval to get wrong)
        log.warning("MOSS-TD: %s", marker_assumed_warning(path, DEFAULT_MARKER_EVERY_S)["message"])
    return DEFAULT_MARKER_EVERY_S, "default"


def load_moss_td(cfg: EngineConfig) -> LoadedModel:
    """Build MOSS-TD on ``cfg.device`` in ``cfg.dtype`` (``device="meta"`` builds shapes only).

    ``load_format`` ``"auto"`` means ``"hf"``: random weights come only from an explicit ``"dummy"``
    (``info["random_weights"]`` then says so).

    Raises:
        CheckpointError: no ``model_path`` (and not ``"dummy"``), missing config/weights, wrong names or
            shapes. ValueError: unknown format.
    """
    path = Path(cfg.model_path) if cfg.model_path else None
    fmt = "hf" if cfg.load_format == "auto" else cfg.load_format
    if fmt == "hf":
        if path is None:  # never fall back to random weights silently: their transcripts are noise
            raise CheckpointError(NO_CHECKPOINT)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: no config.json (MOSS-TD needs a local Hugging Face directory)")
        conf = json.loads((path / "config.json").read_text())
    elif fmt == "dummy":
        conf = dict(cfg.dummy_config)
    else:
        raise ValueError(f"unknown load_format {fmt!r} for moss-td (expected 'hf' or 'dummy')")
    mcfg = MossTDConfig.from_dict(conf)
    mcfg.check()  # ValueError naming the field, before torch builds tensors of a negative size
    marker, marker_source = resolve_marker_interval(path, cfg.marker_interval_s)
    check_feature_extractor(path, mcfg.audio.num_mel_bins)
    rules = read_generation_config(path, (EOS_ID,))  # before the weights: a refused field fails fast
    try:
        template = read_chat_template(path)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    device = torch.device(cfg.device)
    with torch.device("meta"):
        model = MossTDForConditionalGeneration(mcfg)
    if device.type != "meta":
        model = model.to_empty(device=device)
        if mcfg.text.tie_word_embeddings:  # to_empty may replace the shared Parameter; re-tie
            model.lm_head.weight = model.model.language_model.embed_tokens.weight
        if fmt == "hf":
            _copy_weights(model, path)
        else:
            _init_random(model, cfg.seed, float(conf.get("init_std", DEFAULT_INIT_STD)), device)
    model = model.to(dtype=torch_dtype(cfg.dtype)).eval()
    if device.type != "meta":
        model.fuse_projections()  # last: Module.to would split the fused weights again
    tok_file = ASSET_TOKENIZER
    if path is not None and (path / "tokenizer.json").is_file():
        tok_file = path / "tokenizer.json"
    info = {
        "family": "moss-td", "path": str(path) if path else None, "format": fmt, "config": conf,
        "name": path.name if path is not None and fmt != "dummy" else "moss-td-dummy",
        "random_weights": fmt == "dummy",
        "marker_every_s": marker,
        "marker_source": marker_source,
        # said in every result, not only in the load log (transcription.moss_td.pipeline)
        "result_warnings": [marker_assumed_warning(path, marker)] if marker_source == "default" and fmt == "hf"
        else [],
        "eos_token_ids": rules.eos_token_ids,
        "greedy_rules": rules,
        "chat_template": template,  # None: the built-in format (engine.models.moss_td_prompt.render_chat)
        "audio_token_id": mcfg.audio_token_id,
    }
    return LoadedModel(model=model, tokenizer=TextTokenizer(tok_file), info=info)
