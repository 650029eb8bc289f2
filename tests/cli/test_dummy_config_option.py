"""``--dummy-config`` (``engine``, ``transcribe``): a field the model config class does not have, or a value
of the wrong type, is one ``bad_option`` line naming the field, before the model loads."""

from __future__ import annotations

import pytest

from cli.main import main
from tests.conftest import data_file


@pytest.mark.parametrize(("model", "conf", "message"), [
    ("moss-td", '{"text_config": {"num_hidden_layers": "x"}}',
     "field 'text_config.num_hidden_layers' must be int, got 'x'"),
    ("moss-td", '{"no_such": 1}', "unknown field 'no_such' for moss-td (fields: adaptor_input_dim, audio_config, "),
    ("moss-td", '{"audio_config": {"no_such": 1}}', "unknown field 'audio_config.no_such' for moss-td (fields: "),
    ("moss-td", '{"init_std": true}', "field 'init_std' must be a number, got True"),
    ("whisper", '{"d_model": "x"}', "field 'd_model' must be int, got 'x'"),
    ("whisper", '{"num_hidden_layers": 2}', "unknown field 'num_hidden_layers' for whisper (fields: d_model, "),
])
@pytest.mark.parametrize("command", ["engine", "transcribe"])
def test_a_bad_dummy_config_is_one_bad_option_line(capsys, monkeypatch, command, model, conf, message):
    def no_engine(*_a, **_k):
        raise AssertionError("the model must not load with a bad --dummy-config")

    monkeypatch.setattr("engine.Engine", no_engine)
    where = [str(data_file("en_short_yes/yes_1000ms.wav"))] if command == "transcribe" else ["--port", "0"]
    status = main([command, *where, "--model", model, "--load-format", "dummy", "--dummy-config", conf])
    out, err = capsys.readouterr()
    assert status == 2 and out == "", err
    assert err.startswith(f"diarist: error: bad_option: --dummy-config: {message}"), err
    assert err.count("\n") == 1


def test_the_fields_are_the_config_classes():
    """The accepted fields come from the dataclasses: the tiny shapes pass, and a new config field would be
    accepted without a list to update."""
    import dataclasses

    from engine.loaders.dummy_fields import check_dummy_config, dummy_schema
    from engine.loaders.moss_td import TINY_DUMMY_CONFIG
    from engine.models.qwen3 import Qwen3Config
    from engine.models.whisper import WhisperConfig

    check_dummy_config("moss-td", TINY_DUMMY_CONFIG)
    check_dummy_config("whisper", {"d_model": 64, "decoder_layers": 1})
    assert set(dummy_schema("whisper")) == {f.name for f in dataclasses.fields(WhisperConfig)}
    assert set(dummy_schema("moss-td")["text_config"]) == {f.name for f in dataclasses.fields(Qwen3Config)}
    check_dummy_config("moss-td", {"text_config": {"rms_norm_eps": 1}})  # an integer is a float
