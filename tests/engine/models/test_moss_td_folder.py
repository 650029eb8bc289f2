"""Every file of a MOSS-TD checkpoint folder is honoured, and a missing one is said out loud (issue 18).

Checkpoints here are the tiny transformers-built reference of ``moss_reference.py`` written as a released
folder would be; which files are read, and what happens without them, is the checklist in docs/moss_td.md.
"""

from __future__ import annotations

import json
import logging

import pytest

from diarist.transcript import Transcript
from engine import Engine, EngineConfig
from engine.loaders import CheckpointError
from engine.models.moss_td_prompt import build_prompt
from tests.engine.models.moss_reference import Reference, make_audio
from transcription.moss_td_pipeline import build_moss_sequence
from transcription.moss_transcribe import transcribe_moss

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reference():
    return Reference(seed=0)


@pytest.fixture(scope="module")
def bare(reference, tmp_path_factory):
    """A folder with config, weights and tokenizer only (no processor, generation or template files)."""
    return reference.write_checkpoint(tmp_path_factory.mktemp("bare") / "ckpt", shards=1)


def engine_for(path, **kw) -> Engine:
    return Engine(EngineConfig(model="moss-td", model_path=str(path), load_format="hf", kv_budget_bytes=32 << 20,
                               max_running_requests=4, **kw))


class Opts:
    max_new_tokens = 4
    prompt = None


# -- item 1: the time-marker interval ---------------------------------------------------------------------
def test_missing_processor_config_warns_and_every_record_states_the_interval(bare, caplog):
    with caplog.at_level(logging.WARNING, logger="diarist.engine"):
        eng = engine_for(bare)
    warned = [r.getMessage() for r in caplog.records if "time_marker_every_seconds" in r.getMessage()]
    assert len(warned) == 1 and "default of 2 s" in warned[0] and "DIARIST_MOSS_MARKER_INTERVAL_S" in warned[0]
    st = eng.stats()
    assert st["marker_interval_s"] == 2 and st["marker_interval_source"] == "default"
    res = transcribe_moss(eng, make_audio(6, 1), Opts(), None)
    assert res["marker_interval_s"] == 2
    assert Transcript.from_engine({**res, "model": "m"}).marker_interval_s == 2.0


def test_setting_sets_the_interval_and_wins_over_the_folder(reference, tmp_path, caplog):
    five = reference.write_checkpoint(tmp_path / "five", shards=1, marker_every_s=5)
    eng = engine_for(five)
    assert eng.stats()["marker_interval_source"] == "processor_config.json"
    assert eng.stats()["marker_interval_s"] == 5
    with caplog.at_level(logging.WARNING, logger="diarist.engine"):
        three = engine_for(five, marker_interval_s=3)
    assert any("although processor_config.json" in r.getMessage() for r in caplog.records)
    assert three.stats()["marker_interval_s"] == 3 and three.stats()["marker_interval_source"] == "setting"
    wave = make_audio(30, 1)
    seq = build_moss_sequence(three, wave, max_new_tokens=4)
    assert seq.prompt_ids == build_prompt(three.tokenizer, wave.size, None, 3).ids
    assert seq.prompt_ids != build_prompt(three.tokenizer, wave.size, None, 5).ids
    with pytest.raises(CheckpointError, match=">= 0 seconds"):
        engine_for(five, marker_interval_s=-1)


def test_the_setting_reaches_the_engine_config(monkeypatch):
    from diarist.settings import Settings

    monkeypatch.setenv("DIARIST_MOSS_MARKER_INTERVAL_S", "5")
    assert Settings(_env_file=None).engine_config(model="moss-td").marker_interval_s == 5
    monkeypatch.delenv("DIARIST_MOSS_MARKER_INTERVAL_S")
    assert Settings(_env_file=None).engine_config(model="moss-td").marker_interval_s is None
