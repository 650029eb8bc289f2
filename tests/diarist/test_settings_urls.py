"""URL settings are checked by their libraries' own parsers when read (diarist.settings.check_*_url)."""

from __future__ import annotations

import pytest

from diarist.settings import InvalidSettings, Settings


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
])
def test_malformed_urls_name_the_variable_and_hide_the_value(field, url, message):
    with pytest.raises(InvalidSettings) as e:
        Settings(**{field: url})
    variable = f"DIARIST_{field.upper()}"
    assert e.value.variables == [variable]
    assert str(e.value).startswith(f"{variable}: {message}"), str(e.value)
    assert "pw" not in str(e.value) and "Value error" not in str(e.value)
