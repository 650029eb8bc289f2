"""URL settings are checked by their libraries' own parsers when read (diarist.urls)."""

from __future__ import annotations

import pytest

from diarist.env_settings import InvalidSettings
from diarist.settings import Settings


@pytest.mark.parametrize(("field", "url"), [
    ("database_url", "postgresql+psycopg://u:p@127.0.0.1:1/diarist"),  # nothing listens there: not checked now
    ("database_url", "postgresql://u@db/diarist"),
    ("database_url", "sqlite:///relative.sqlite3"),
    ("broker_url", "redis://:p@127.0.0.1:1/0"),
    ("broker_url", "rediss://h:6380/1"),
    ("broker_url", "memory://localhost/"),
    ("broker_url", "filesystem://"),
    ("broker_url", "amqp://guest@rabbit//"),
    ("events_url", "redis://127.0.0.1:1/0"),
    ("events_url", "unix:///run/redis.sock"),
])
def test_well_formed_urls_are_kept_as_given(field, url):
    assert getattr(Settings(**{field: url}), field) == url


@pytest.mark.parametrize(("field", "url", "message"), [
    ("database_url", "notaurl", "not a SQLAlchemy URL (dialect+driver://user:password@host:port/database)"),
    ("database_url", "postgresql://u:pw@db:99999/x", "port 99999 is outside 0-65535"),
    ("database_url", "mysql+nosuchdriver://u:pw@db/x", "unknown database dialect or driver 'mysql+nosuchdriver'"),
    ("broker_url", "redis://u:pw@h:99999/0", "not a broker URL: Port out of range 0-65535"),
    ("broker_url", "reddis://u:pw@h/0", "unknown broker transport 'reddis'"),
    ("events_url", "http://u:pw@h/", "not a Redis URL: Redis URL must specify one of the following schemes"),
    ("events_url", "redis://u:pw@h:port/0", "not a Redis URL: Port could not be cast to integer"),
    ("engine_url", "http://127.0.0.1:notaport", "not an engine URL: Invalid port: 'notaport'"),
    ("engine_url", "notaurl", "engine URLs are http:// or https:// with a host"),
    ("engine_url", "http://a:8100,ftp://b", "engine URLs are http:// or https:// with a host"),
    ("s3_endpoint_url", "notaurl", "not an S3 endpoint URL"),
    ("s3_endpoint_url", "http://minio:notaport", "not an S3 endpoint URL"),
])
def test_malformed_urls_name_the_variable_and_hide_the_value(field, url, message):
    """A URL its library cannot parse is a bad setting when read (a worker that would start and fail, or
    botocore's traceback at the first upload, is worse); the reason is said once, a credential never."""
    with pytest.raises(InvalidSettings) as e:
        Settings(**{field: url})
    variable = f"DIARIST_{field.upper()}"
    assert e.value.variables == [variable]
    assert str(e.value).startswith(f"{variable}: {message}"), str(e.value)
    assert "pw" not in str(e.value) and "Value error" not in str(e.value)
    assert str(e.value).count(url.split(",")[-1]) <= 1  # a non-secret value is echoed at most once


def test_well_formed_engine_and_s3_endpoint_urls_are_kept():
    s = Settings(engine_url="http://a:8100/, https://b", s3_endpoint_url="http://127.0.0.1:9000")
    assert s.engine_url == ["http://a:8100", "https://b"] and s.s3_endpoint_url == "http://127.0.0.1:9000"
