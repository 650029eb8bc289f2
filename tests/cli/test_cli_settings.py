"""A ``DIARIST_*`` URL that cannot be parsed, or names a driver or transport that does not exist, is a bad
setting: ``invalid_setting`` on one line and exit 2 before anything starts, not a traceback or an outage."""

from __future__ import annotations

import pytest

from cli.main import main


@pytest.mark.parametrize(("variable", "value", "reason"), [
    ("DIARIST_DATABASE_URL", "notaurl", "not a SQLAlchemy URL"),
    ("DIARIST_DATABASE_URL", "postgresql://x:s3cret@:badport/db", "not a SQLAlchemy URL: invalid literal for int()"),
    ("DIARIST_DATABASE_URL", "postgresql+nosuch://x:s3cret@db/diarist",
     "unknown database dialect or driver 'postgresql+nosuch'"),
    ("DIARIST_BROKER_URL", "redis://:s3cret@db:notaport", "not a broker URL: Port could not be cast to integer"),
    ("DIARIST_BROKER_URL", "notaurl", "not a broker URL"),
    ("DIARIST_BROKER_URL", "nosuch://x:s3cret@db", "unknown broker transport 'nosuch'"),
])
@pytest.mark.parametrize("argv", [["serve"], ["migrate"], ["worker", "--class", "short"]],
                         ids=["serve", "migrate", "worker"])
def test_a_malformed_url_is_invalid_setting_in_one_line(capsys, monkeypatch, argv, variable, value, reason):
    import diarist.db

    def nothing_starts(*_a, **_k):
        raise AssertionError("nothing may start with a bad setting")

    monkeypatch.setattr(diarist.db, "upgrade", nothing_starts)
    monkeypatch.setenv(variable, value)
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2 and out == "", err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"diarist: error: invalid_setting: {variable}: {reason}"), err
    assert "s3cret" not in err  # the URL's password is never echoed


def test_migrate_names_the_database_without_credentials_or_query(capsys, monkeypatch, tmp_path):
    """``migrate`` says which database it reached or could not reach as ``host:port/name`` (a file for
    SQLite): a password in the userinfo or in libpq's ``?password=`` query is never printed."""
    import logging

    from tests.servers import free_port

    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a fresh process (see test_cli)
    port = free_port()
    monkeypatch.setenv("DIARIST_DATABASE_URL",
                       f"postgresql+psycopg://u:pw1@127.0.0.1:{port}/diarist?user=diarist&password=s3cret")
    status = main(["migrate"])
    out, err = capsys.readouterr()
    assert status == 1 and out == "", err
    assert err.startswith(f"diarist: error: database_unavailable: cannot reach the database at "
                          f"127.0.0.1:{port}/diarist: "), err
    assert "s3cret" not in err and "pw1" not in err and "password" not in err

    db = tmp_path / "d.sqlite3"
    monkeypatch.setenv("DIARIST_DATABASE_URL", f"sqlite:///{db}")
    assert main(["migrate"]) == 0
    out, err = capsys.readouterr()
    assert out == f"database at {db} is at revision head\n" and db.is_file(), (out, err)


@pytest.mark.parametrize(("url", "named"), [
    ("postgresql+psycopg://u:p@db.example:5433/jobs?password=x", "db.example:5433/jobs"),
    ("postgresql+psycopg://u:p@db.example/jobs", "db.example/jobs"),
    ("postgresql+psycopg://u:p@[::1]:5432/jobs", "[::1]:5432/jobs"),
    ("postgresql+psycopg:///jobs?host=/run/postgresql&password=x", "jobs"),
    ("sqlite:///:memory:", ":memory:"),
])
def test_database_named(url, named):
    from cli.commands.migrate import database_named

    assert database_named(url) == named
