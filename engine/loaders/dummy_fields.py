"""The fields ``EngineConfig.dummy_config`` (``--dummy-config``) may set, asked of the model config dataclasses.

A random-weight model is shaped by its family's config class: Whisper by
:class:`engine.models.whisper.WhisperConfig`; MOSS-TD by the ``config.json`` layout that
:meth:`engine.models.moss_td.MossTDConfig.from_dict` reads (``text_config``: :class:`Qwen3Config` fields,
``audio_config``: :class:`WhisperConfig` fields, and the top-level scalars of ``MossTDConfig``). A field the
class does not have would be dropped silently by ``from_dict``, and a value of the wrong type would fail deep
in model construction, so both are refused here by name.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

MOSS_TD_TOP_LEVEL = {"tie_word_embeddings": bool, "adaptor_input_dim": int, "init_std": float}
"""Top-level ``config.json`` keys MOSS-TD reads besides ``MossTDConfig``'s own scalar fields:
``tie_word_embeddings`` and ``adaptor_input_dim`` (``MossTDConfig.from_dict``) and ``init_std`` (the random
initialisation's standard deviation, ``engine.loaders.moss_td``)."""


def _scalar_fields(cls: type) -> dict[str, type]:
    """``cls``'s dataclass fields and their types, without the nested dataclasses."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])}


def dummy_schema(model: str) -> dict[str, Any]:
    """``{field: type}`` of the ``dummy_config`` keys of the ``model`` family; a nested section
    (``text_config``) maps to its own ``{field: type}``. Raises ValueError for an unknown family."""
    from engine.models.qwen3 import Qwen3Config
    from engine.models.whisper import WhisperConfig

    if model == "whisper":
        return _scalar_fields(WhisperConfig)
    if model == "moss-td":
        from engine.models.moss_td import MossTDConfig

        return {"text_config": _scalar_fields(Qwen3Config), "audio_config": _scalar_fields(WhisperConfig),
                **_scalar_fields(MossTDConfig), **MOSS_TD_TOP_LEVEL}
    raise ValueError(f"unknown model {model!r}")


def _fits(value: Any, kind: type) -> bool:
    """Whether a JSON value is of the field's type (an integer is a float; a bool is no number)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True  # a type no shape field has today: left to the config class


def check_dummy_config(model: str, conf: dict[str, Any]) -> None:
    """Refuse a ``dummy_config`` for the ``model`` family that names a field its config class does not have
    or gives a field a value of another type.

    Raises:
        ValueError: naming the field (``text_config.num_hidden_layers``) and what it accepts.
    """

    def check(section: dict[str, Any], schema: dict[str, Any], where: str) -> None:
        for key, value in section.items():
            name = f"{where}{key}"
            if key not in schema:
                raise ValueError(f"unknown field {name!r} for {model} (fields: {', '.join(sorted(schema))})")
            kind = schema[key]
            if isinstance(kind, dict):
                if not isinstance(value, dict):
                    raise ValueError(f"field {name!r} must be a JSON object of fields, got {value!r}")  # noqa: TRY004 - a bad value, one error type for the caller
                check(value, kind, f"{name}.")
            elif not _fits(value, kind):
                raise ValueError(f"field {name!r} must be {'a number' if kind is float else kind.__name__}, "
                                 f"got {value!r}")

    check(conf, dummy_schema(model), "")
