"""Checkpoint loaders: CTranslate2 Whisper (bundled default), local HF safetensors dirs, dummy weights."""

from engine.loaders.base import LoadedModel
from engine.loaders.ct2 import CheckpointError, load_ct2_whisper, read_ct2_model_bin
from engine.loaders.registry import bundled_whisper_dir, load_model

__all__ = ["CheckpointError", "LoadedModel", "bundled_whisper_dir", "load_ct2_whisper", "load_model",
           "read_ct2_model_bin"]
