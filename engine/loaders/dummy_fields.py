"""The fields ``EngineConfig.dummy_config`` (``--dummy-config``) may set, asked of the model config dataclasses.

A random-weight model is shaped by its family's config class; each family's loader declares the schema of its
overrides and the value check (:class:`engine.loaders.registry.FamilyLoader`: Whisper's
:class:`engine.models.whisper.WhisperConfig` fields; MOSS-TD's ``config.json`` layout,
:func:`engine.loaders.moss_td.dummy_schema`). A field the class does not have would be dropped silently by
``from_dict``, a value of the wrong type or out of range (a negative size, heads that do not divide the
width) would fail deep in model construction, so all three are refused here by name.
"""

from __future__ import annotations

from typing import Any


def _family(model: str) -> Any:
    """The loader table's row of ``model`` (:data:`engine.loaders.registry.FAMILY_LOADERS`).
    Raises ValueError for an unknown family."""
    from engine.loaders.registry import family_loader  # torch: imported when a dummy config is checked

    return family_loader(model)


def dummy_schema(model: str) -> dict[str, Any]:
    """``{field: type}`` of the ``dummy_config`` keys of the ``model`` family; a nested section
    (``text_config``) maps to its own ``{field: type}``. Raises ValueError for an unknown family."""
    return _family(model).dummy_schema()


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
    """Refuse a ``dummy_config`` for the ``model`` family that names a field its config class does not have,
    gives a field a value of another type, or shapes a model that cannot be built (the config class's own
    ``check``: sizes positive, heads dividing the width, ...).

    Raises:
        ValueError: naming the field (``text_config.num_hidden_layers``) and what it accepts.
    """
    family = _family(model)

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

    check(conf, family.dummy_schema(), "")
    family.check_dummy(conf)  # the types are right: now the values, as the loader will build the config
