"""The value rules every model config shares (a size is a positive integer, a scale a positive number), and
the config dataclasses' scalar fields that ``dummy_config`` may set.

Each config class's ``check`` names the fields a rule covers; the messages are written here once. ``where``
is the field's prefix as ``config.json`` nests it (``text_config.``), so the message names what a user wrote.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any


def check_positive(cfg: Any, names: tuple[str, ...], where: str = "") -> None:
    """Refuse a field of ``cfg`` among ``names`` that is not above zero (a NaN is not).

    Raises:
        ValueError: naming the first such field and its value.
    """
    for name in names:
        value = getattr(cfg, name)
        if not (isinstance(value, int | float) and not isinstance(value, bool) and value > 0
                and not math.isinf(value)):
            raise ValueError(f"field '{where}{name}' must be positive, got {value!r}")


def check_divides(cfg: Any, divisor: str, total: str, where: str = "") -> None:
    """Refuse ``cfg.<total>`` that ``cfg.<divisor>`` does not divide (call after :func:`check_positive`).

    Raises:
        ValueError: naming both fields and their values.
    """
    d, t = getattr(cfg, divisor), getattr(cfg, total)
    if t % d:
        raise ValueError(f"field '{where}{total}' ({t}) must be a multiple of '{where}{divisor}' ({d})")


def scalar_fields(cls: type) -> dict[str, type]:
    """``cls``'s dataclass fields and their types, without the nested dataclasses."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])}
