"""The base of every settings class read from ``DIARIST_*`` variables, and its one error: a bad value is
an :class:`InvalidSettings` naming the environment variable, never pydantic's report of a field name."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

CREDENTIAL_FIELDS = ("secret", "key", "database_url", "broker_url", "events_url")
"""Parts of setting names whose values may hold a credential (a URL's password): a rejected value of such a
setting is never echoed in the error (:class:`EnvSettings`)."""


class InvalidSettings(ValueError):
    """Settings read from the environment that do not validate; the message names each variable.

    ``code`` is ``invalid_setting`` (the CLI prints it and exits 2); ``variables`` the environment variables
    at fault (e.g. ``["DIARIST_ADMIN_ENGINE_URLS"]``), empty when pydantic-settings could not say which.
    """

    code = "invalid_setting"

    def __init__(self, message: str, variables: list[str]) -> None:
        super().__init__(message)
        self.variables = variables


class EnvSettings(BaseSettings):
    """Base of every settings class read from ``DIARIST_*`` variables: a bad value raises
    :class:`InvalidSettings` naming the variable (``DIARIST_ADMIN_ENGINE_URLS: ...``), not pydantic's
    report of a field name the operator never typed."""

    def __init__(self, *args: Any, **values: Any) -> None:
        try:
            super().__init__(*args, **values)
        except ValidationError as e:
            names, lines = [], []
            for err in e.errors():
                field = str(err["loc"][0]) if err["loc"] else ""
                name = prefix_of(self) + field.upper() if field else type(self).__name__
                names.append(name)
                # a credential never reaches the operator's log, even one that failed its check
                shown = "" if any(w in field for w in CREDENTIAL_FIELDS) else f" (got {err.get('input')!r})"
                # our validators' reason as they wrote it, without pydantic's "Value error, " prefix
                msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
                lines.append(f"{name}: {msg}{shown}")
            raise InvalidSettings("; ".join(lines), names) from None
        except SettingsError as e:  # a list or dict variable that is not JSON; the message names its field
            field = re.search(r'field "(\w+)"', str(e))
            names = [prefix_of(self) + field.group(1).upper()] if field else []
            where = ", ".join(names) or type(self).__name__
            raise InvalidSettings(f"{where}: not valid JSON ({e})", names) from None


def prefix_of(settings: BaseSettings) -> str:
    """The environment prefix of ``settings``' variables (``DIARIST_``, ``DIARIST_ADMIN_``)."""
    return str(settings.model_config.get("env_prefix", "")).upper()
