"""`diarist transcribe --model moss-td --load-format dummy` runs the MOSS-TD path end to end (random text)."""

from __future__ import annotations

import json

import pytest

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


def engine_config_of(monkeypatch, argv):
    """The ``EngineConfig`` a command builds its engine from (the engine itself is not loaded)."""
    import engine

    seen = {}

    class Built(Exception):
        pass

    def capture(config):
        seen["config"] = config
        raise Built

    monkeypatch.setattr(engine, "Engine", capture)
    try:
        main(argv)
    except Built:
        return seen["config"]
    raise AssertionError(f"{argv} did not build an engine")


def test_engine_takes_dummy_config_as_transcribe_does(monkeypatch):
    """``diarist engine --dummy-config`` (tiny or JSON) reaches the engine config as transcribe's does."""
    from engine.loaders.moss_td import TINY_DUMMY_CONFIG

    monkeypatch.delenv("DIARIST_LOAD_FORMAT", raising=False)
    wav = str(data_file("en_short_yes/yes_1000ms.wav"))
    shapes = {"text_config": {"num_hidden_layers": 1}}
    for value, want in (("tiny", TINY_DUMMY_CONFIG), (json.dumps(shapes), shapes)):
        args = ["--model", "moss-td", "--load-format", "dummy", "--dummy-config", value, "--device", "cpu"]
        served = engine_config_of(monkeypatch, ["engine", "--host", "127.0.0.1", "--port", "0", *args])
        local = engine_config_of(monkeypatch, ["transcribe", wav, *args])
        assert served.dummy_config == local.dummy_config == want
        assert served.load_format == local.load_format == "dummy" and served.model == local.model == "moss-td"


@pytest.mark.parametrize("command", ["engine", "transcribe"])
@pytest.mark.parametrize(("value", "load_format", "message"), [
    ("{not json", "dummy", "--dummy-config is not JSON: "),
    ("[1, 2]", "dummy", "--dummy-config must be a JSON object of config fields, or 'tiny'; got '[1, 2]'"),
    ('{"d_model": 64}', "auto", "--dummy-config shapes random weights: it needs --load-format dummy"),
], ids=["not_json", "not_an_object", "not_dummy_weights"])
def test_a_bad_dummy_config_is_one_line_before_the_model_loads(capsys, monkeypatch, command, value, load_format,
                                                               message):
    import engine

    def no_engine(*_a, **_k):
        raise AssertionError("the model must not load for a bad --dummy-config")

    monkeypatch.setattr(engine, "Engine", no_engine)
    monkeypatch.delenv("DIARIST_LOAD_FORMAT", raising=False)
    head = {"engine": ["engine", "--host", "127.0.0.1", "--port", "0"],
            "transcribe": ["transcribe", str(data_file("en_short_yes/yes_1000ms.wav"))]}[command]
    status = main([*head, "--model", "moss-td", "--load-format", load_format, "--dummy-config", value])
    out = capsys.readouterr()
    assert status == 2 and out.out == "", out.err
    assert out.err.startswith(f"diarist: error: bad_option: {message}") and out.err.count("\n") == 1
