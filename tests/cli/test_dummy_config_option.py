"""``--dummy-config`` (``engine``, ``transcribe``): a field the model config class does not have, a value
of the wrong type, or a value no model can be built from, is one ``bad_option`` line naming the field,
before the model loads."""

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
    # values out of range (the config classes' own check)
    ("whisper", '{"d_model": -5}', "field 'd_model' must be positive, got -5\n"),
    ("whisper", '{"decoder_layers": 0}', "field 'decoder_layers' must be positive, got 0\n"),
    ("whisper", '{"d_model": 100}', "field 'd_model' (100) must be a multiple of 'encoder_attention_heads' (6)\n"),
    ("whisper", '{"d_model": 64, "encoder_attention_heads": 4}',
     "field 'd_model' (64) must be a multiple of 'decoder_attention_heads' (6)\n"),
    ("moss-td", '{"text_config": {"hidden_size": -1}}', "field 'text_config.hidden_size' must be positive, got -1\n"),
    ("moss-td", '{"text_config": {"num_key_value_heads": 3}}',
     "field 'text_config.num_attention_heads' (16) must be a multiple of 'text_config.num_key_value_heads' (3)\n"),
    ("moss-td", '{"text_config": {"head_dim": 33}}',
     "field 'text_config.head_dim' must be even (rotate-half RoPE), got 33\n"),
    ("moss-td", '{"text_config": {"rms_norm_eps": 0}}', "field 'text_config.rms_norm_eps' must be positive, got 0\n"),
    ("moss-td", '{"audio_config": {"d_model": 100}}',
     "field 'audio_config.d_model' (100) must be a multiple of 'audio_config.encoder_attention_heads' (16)\n"),
    ("moss-td", '{"encoder_batch": 0}', "field 'encoder_batch' must be positive, got 0\n"),
    ("moss-td", '{"init_std": -0.5}', "field 'init_std' must be positive, got -0.5\n"),
    ("moss-td", '{"init_std": NaN}', "field 'init_std' must be positive, got nan\n"),
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
    check_dummy_config("whisper", {"d_model": 96, "decoder_layers": 1})
    assert set(dummy_schema("whisper")) == {f.name for f in dataclasses.fields(WhisperConfig)}
    assert set(dummy_schema("moss-td")["text_config"]) == {f.name for f in dataclasses.fields(Qwen3Config)}
    check_dummy_config("moss-td", {"text_config": {"rms_norm_eps": 1}})  # an integer is a float
    # MOSS-TD uses Whisper's encoder alone: its audio_config's unused decoder heads need not divide d_model
    check_dummy_config("moss-td", {"audio_config": {"d_model": 64, "encoder_attention_heads": 4}})


def test_every_family_has_a_loader():
    """The loader table (its dummy schema, check and tiny shapes) covers every family the service knows."""
    from engine.config import MODEL_FAMILIES
    from engine.loaders.registry import FAMILY_LOADERS

    assert tuple(FAMILY_LOADERS) == MODEL_FAMILIES
