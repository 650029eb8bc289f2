"""Options that several ``diarist`` commands take, parsed once: ``--dummy-config`` and ``--kv-dtype``
(``transcribe``, ``engine``).

A bad value raises :class:`BadOption`, which the CLI prints as its one error line and exits 2 (cli.main).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

DUMMY_CONFIG_HELP = ("JSON shape overrides for --load-format dummy (config.json fields of the model family), or "
                     "'tiny' for the CI-sized model")


class BadOption(Exception):
    """An option value the command cannot use. ``code``: ``bad_option`` (the value itself), or ``bad_model``
    (it names a model shape that does not exist); the message names the option."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_kv_dtype(p: argparse.ArgumentParser) -> None:
    """Add ``--kv-dtype`` to ``p``: the choices are :data:`engine.config.KV_DTYPES`, the help is the
    ``DIARIST_KV_DTYPE`` setting's description (one text for the CLI, the settings and their docs)."""
    from diarist.settings import Settings
    from engine.config import KV_DTYPES

    p.add_argument("--kv-dtype", default=None, choices=KV_DTYPES,
                   help=f"(default DIARIST_KV_DTYPE) {Settings.model_fields['kv_dtype'].description}")


def add_dummy_config(p: argparse.ArgumentParser) -> None:
    """Add ``--dummy-config`` to ``p`` (read it with :func:`dummy_config`)."""
    p.add_argument("--dummy-config", default=None, help=DUMMY_CONFIG_HELP)


def dummy_config(text: str | None, model: str, load_format: str) -> dict[str, Any] | None:
    """The ``EngineConfig.dummy_config`` that ``--dummy-config TEXT`` asks for, None when it is not given.

    ``TEXT`` is ``tiny`` (:func:`engine.loaders.registry.tiny_dummy_config` of ``model``) or a JSON object
    (RFC 8259) of config fields. ``load_format`` is the one the engine will use: the option shapes random
    weights only, so with any other format it is refused rather than silently ignored.

    Raises:
        BadOption: ``bad_option`` for text that is not a JSON object, a field the model family's config
            class does not have or a value of the wrong type (the message names the field), or the option
            without ``load_format`` dummy; ``bad_model`` for ``tiny`` of an unknown model family.
    """
    if text is None:
        return None
    if load_format != "dummy":
        raise BadOption("bad_option", f"--dummy-config shapes random weights: it needs --load-format dummy "
                                      f"(the load format here is {load_format})")
    if text == "tiny":
        from engine.loaders.registry import tiny_dummy_config

        try:
            return tiny_dummy_config(model)
        except ValueError as e:
            raise BadOption("bad_model", str(e)) from None
    try:
        conf = json.loads(text)
    except ValueError as e:
        raise BadOption("bad_option", f"--dummy-config is not JSON: {e}") from None
    if not isinstance(conf, dict):
        raise BadOption("bad_option", f"--dummy-config must be a JSON object of config fields, or 'tiny'; "
                                      f"got {text!r}")
    from engine.loaders.dummy_fields import check_dummy_config

    try:  # the fields are the model config class's (engine.loaders.dummy_fields)
        check_dummy_config(model, conf)
    except ValueError as e:
        raise BadOption("bad_option", f"--dummy-config: {e}") from None
    return conf
