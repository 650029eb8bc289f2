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
