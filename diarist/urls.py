"""URL settings checked by their libraries' own parsers when read, never by connecting: a URL that cannot be
parsed is a bad setting (``invalid_setting`` at start), a well-formed one whose server is down is an outage
when it is used. Each check raises ValueError with the reason and never echoes a URL that may hold a
password. Used by :mod:`diarist.settings` and :mod:`api.admin.config`. Torch-free.
"""

from __future__ import annotations

import json
from typing import Any


def parse_engine_urls(text: str) -> list[str]:
    """Engine server URLs from ``text``: a JSON list (``["http://a:8100", "http://b:8101"]``) or URLs separated
    by commas (``http://a:8100,http://b:8101``; one URL alone is a list of one). Order is kept: the first is
    the worker's own engine.

    Raises:
        ValueError: no URL, or one that is not ``http://`` / ``https://``.
    """
    text = text.strip()
    return check_engine_urls(json.loads(text) if text.startswith("[") else text.split(","))


def check_engine_urls(urls: Any) -> list[str]:
    """``urls`` (a list of strings) stripped of blanks and trailing ``/``, in order. Raises ValueError as
    :func:`parse_engine_urls` does."""
    if not isinstance(urls, list | tuple) or not all(isinstance(u, str) for u in urls):
        raise ValueError(f"engine URLs must be a list of strings, not {urls!r}")
    import httpx

    out = [u.strip().rstrip("/") for u in urls if u.strip()]
    if not out:
        raise ValueError("no engine URL given")
    for u in out:  # httpx's own parser (the client the workers use): scheme, host and a numeric port
        try:
            parsed = httpx.URL(u)
        except httpx.InvalidURL as e:
            raise ValueError(f"not an engine URL: {e}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("engine URLs are http:// or https:// with a host (http://127.0.0.1:8100)")
    return out


def coerce_engine_urls(value: Any) -> list[str]:
    """A settings field's engine URL list from the environment's string (:func:`parse_engine_urls`) or a
    list given in code (:func:`check_engine_urls`); raises ValueError as they do."""
    return parse_engine_urls(value) if isinstance(value, str) else check_engine_urls(value)


MAX_PORT = 65535
"""Largest TCP port number (RFC 793's 16-bit field)."""

def check_database_url(url: str) -> str:
    """``url`` when SQLAlchemy can use it: parsed by SQLAlchemy's own parser (``make_url``), with a dialect
    and DBAPI driver that are installed (``postgresql+psycopg``, ``sqlite``) and a port in ``0..MAX_PORT``.
    Nothing is connected: a server that is down is an outage when it is used, not a bad setting.

    Raises:
        ValueError: the reason, never the URL itself (it may hold a password).
    """
    from sqlalchemy import exc
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except exc.ArgumentError:
        raise ValueError("not a SQLAlchemy URL (dialect+driver://user:password@host:port/database)") from None
    except ValueError as e:  # make_url's int() of a port that is not a number
        raise ValueError(f"not a SQLAlchemy URL: {e}") from None
    if parsed.port is not None and not 0 <= parsed.port <= MAX_PORT:
        raise ValueError(f"port {parsed.port} is outside 0-{MAX_PORT}")
    try:
        parsed.get_dialect().import_dbapi()
    except exc.NoSuchModuleError:
        raise ValueError(f"unknown database dialect or driver {parsed.drivername!r}") from None
    except ImportError as e:
        raise ValueError(f"the driver of {parsed.drivername!r} is not installed ({e})") from None
    return url


def check_broker_url(url: str) -> str:
    """``url`` when Celery can use it as a broker: parsed by kombu's own parser (``kombu.utils.url.parse_url``)
    with a transport kombu knows (``redis``, ``rediss``, ``memory``, ``filesystem``, ``amqp``, ...; kombu's
    ``sqla+<db>`` form is named by the part before ``+``, as kombu's Connection reads it). Nothing is connected.

    Raises:
        ValueError: the reason, never the URL itself (it may hold a password).
    """
    from kombu.transport import TRANSPORT_ALIASES
    from kombu.utils.url import parse_url

    try:
        transport = parse_url(url)["transport"]
    except ValueError as e:  # urllib's port check: "Port could not be cast to integer value as ..."
        raise ValueError(f"not a broker URL: {e}") from None
    if "://" not in url:
        raise ValueError("not a broker URL (transport://user:password@host:port/vhost, e.g. "
                         "redis://localhost:6379/0)")
    if transport.split("+", 1)[0] not in TRANSPORT_ALIASES:  # the names kombu resolves (its registry)
        raise ValueError(f"unknown broker transport {transport!r}")
    return url


def check_s3_endpoint_url(url: str) -> str:
    """``url`` when botocore accepts it as an endpoint (``botocore.utils.is_valid_endpoint_url``:
    ``http(s)://host[:port]``) and its port is a number; nothing is connected.

    Raises:
        ValueError: the reason.
    """
    from urllib.parse import urlsplit

    from botocore.utils import is_valid_endpoint_url

    try:
        port = urlsplit(url).port  # botocore's check leaves the port to the first request: urlsplit's int()
    except ValueError:
        raise ValueError("not an S3 endpoint URL: the port is not a number in 0-65535") from None
    if not is_valid_endpoint_url(url) or (port is not None and not 0 <= port <= MAX_PORT):
        raise ValueError("not an S3 endpoint URL (http(s)://host[:port], e.g. http://127.0.0.1:9000)")
    return url


def check_redis_url(url: str) -> str:
    """``url`` when redis-py can connect with it: parsed by redis-py's own parser
    (``redis.connection.parse_url``: ``redis://``, ``rediss://`` or ``unix://``, a numeric port, a db number).

    Raises:
        ValueError: the reason, never the URL itself.
    """
    from redis.connection import parse_url

    try:
        parse_url(url)
    except ValueError as e:
        raise ValueError(f"not a Redis URL: {e}") from None
    return url
