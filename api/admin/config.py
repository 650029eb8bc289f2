"""Dashboard settings: environment variables with the prefix ``DIARIST_ADMIN_``.

Kept apart from :class:`diarist.settings.Settings` because only the API process reads them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from diarist.env_settings import EnvSettings
from diarist.urls import coerce_engine_urls


class AdminSettings(EnvSettings):
    """``session_ttl_s`` seconds; ``engine_urls`` the engine servers whose ``/stats`` the dashboard shows."""

    model_config = SettingsConfigDict(env_prefix="DIARIST_ADMIN_", env_file=None, extra="ignore")

    session_secret: str | None = Field(
        None, description="HMAC key for session cookies; set it when several API replicas serve /admin. "
                          "Unset: derived from DIARIST_WEBHOOK_SECRET, else random per process.")
    session_ttl_s: int = Field(12 * 3600, description="A login lasts this long.")
    cookie_secure: bool = Field(True, description="Send the session cookie over HTTPS only (browsers also "
                                                  "accept it on http://localhost).")
    engine_urls: Annotated[list[str] | None, NoDecode] = Field(
        None, description="Engine servers whose /stats the dashboard, /metrics and /readyz show: comma-separated "
        "URLs or a JSON list, as DIARIST_ENGINE_URL; default DIARIST_ENGINE_URL's.")
    engine_timeout_s: float = Field(1.0, description="How long the dashboard and /metrics wait for one engine's "
                                    "/stats before showing it down.")
    page_size: int = Field(50, description="Jobs per page of the jobs table.")
    refresh_s: float = Field(5.0, description="How often the overview polls for fresh numbers.")

    @field_validator("engine_urls", mode="before")
    @classmethod
    def _engine_urls(cls, value: Any) -> Any:
        """The same forms and checks as ``DIARIST_ENGINE_URL`` (:func:`diarist.urls.parse_engine_urls`)."""
        return None if value is None else coerce_engine_urls(value)


@lru_cache
def get_admin_settings() -> AdminSettings:
    """The process's dashboard settings, read once; :func:`api.app.create_app` reads them at startup so a
    bad value stops the API there.

    Raises:
        diarist.env_settings.InvalidSettings: a ``DIARIST_ADMIN_*`` value that does not validate.
    """
    return AdminSettings()
