"""`diarist transcribe --model moss-td --load-format dummy` runs the MOSS-TD path end to end (random text)."""

from __future__ import annotations

import json

from cli.main import main
from tests.conftest import data_file


def test_moss_td_dummy_end_to_end(capsys, caplog):
    with caplog.at_level("WARNING", logger="diarist.engine"):
        status = main(["transcribe", str(data_file("en_jfk_inaugural/jfk.flac")), "--model", "moss-td",
                       "--load-format", "dummy", "--dummy-config", "tiny", "--max-new-tokens", "12",
                       "--format", "json"])
    out = capsys.readouterr()
    assert status == 0, out.err
    t = json.loads(out.out)
    assert t["duration"] == 11.0 and t["model"] == "moss-td-dummy"
    assert t["random_weights"] is True  # the result itself says its text is noise
    assert any("RANDOM weights" in r.getMessage() for r in caplog.records)  # and so does the startup log
    # Random weights rarely stop on their own: the 12-token budget ends it, and that is never a silent success.
    assert t["finish_reason"] in ("length", "stop", "repetition")
    if t["finish_reason"] != "stop":
        assert t["incomplete"] is True and t["incomplete_reason"]


def test_moss_td_bad_dummy_config_is_a_clear_error(capsys):
    status = main(["transcribe", str(data_file("en_jfk_inaugural/jfk.flac")), "--model", "moss-td",
                   "--load-format", "dummy", "--dummy-config", "{not json"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("diarist: error: bad_option:") and err.count("\n") == 1


def test_moss_td_without_a_checkpoint_refuses_to_start(capsys):
    """No silent random weights: ``--model moss-td`` without ``--model-path`` is one clear line, exit 2, before
    any audio is decoded (random weights need an explicit ``--load-format dummy``)."""
    status = main(["transcribe", str(data_file("en_jfk_inaugural/jfk.flac")), "--model", "moss-td"])
    out = capsys.readouterr()
    assert status == 2 and out.out == ""
    assert out.err.startswith("diarist: error: bad_model: moss-td needs its checkpoint") and out.err.count("\n") == 1
    assert "--model-path" in out.err and "--load-format dummy" in out.err


def test_engine_server_without_a_checkpoint_refuses_to_start(capsys, monkeypatch):
    monkeypatch.delenv("DIARIST_MODEL_PATH", raising=False)
    monkeypatch.delenv("DIARIST_LOAD_FORMAT", raising=False)
    status = main(["engine", "--model", "moss-td", "--port", "0"])  # fails before the model loads
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("diarist: error: bad_model: moss-td needs its checkpoint")
