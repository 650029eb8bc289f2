"""What every loader returns, and the dtype names they accept: the loaders' shared vocabulary.

Each model family's loader (``registry`` for Whisper, ``moss_td``) imports this module and
``registry.load_model`` dispatches to them, so no loader imports the dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from engine.models.interface import EngineModel
from engine.tokenizer import TextTokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """A model ready for the runner (an ``nn.Module`` on its device and dtype), with its tokenizer and
    checkpoint facts (``info``)."""

    model: EngineModel
    tokenizer: TextTokenizer
    info: dict[str, Any] = field(default_factory=dict)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config name (``float32``, ``bfloat16``, ``float16``).

    Raises:
        ValueError: any other name.
    """
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None
