"""The family registry: every family the engine loads has one pipeline, with that family's facts."""

from types import SimpleNamespace

import pytest

from engine.config import FAMILIES, MODEL_FAMILIES
from transcription.audio import Frontend
from transcription.limits import MAX_DURATION_S
from transcription.pipeline import PIPELINES, pipeline_class


def test_every_loadable_family_has_a_pipeline_and_limits():
    assert set(PIPELINES) == set(MODEL_FAMILIES) == set(FAMILIES) == set(MAX_DURATION_S)
    for name, cls in PIPELINES.items():
        assert cls.family == name and cls.frontend is Frontend(FAMILIES[name].frontend)
    assert PIPELINES["whisper"].frontend is Frontend.FFMPEG and PIPELINES["moss-td"].frontend is Frontend.LIBROSA
    assert not PIPELINES["whisper"].takes_fixed_output_tokens and PIPELINES["moss-td"].takes_fixed_output_tokens


def test_an_engine_of_an_unknown_family_is_refused():
    engine = SimpleNamespace(loaded=SimpleNamespace(info={"family": "wav2vec"}))
    with pytest.raises(ValueError, match="no transcription pipeline for model family 'wav2vec'"):
        pipeline_class(engine)
    with pytest.raises(ValueError, match="unknown model family 'wav2vec'"):
        Frontend.for_family("wav2vec")


def test_moss_td_refuses_translate_before_decoding():
    """The family's check runs first: undecodable bytes never reach the decoder."""
    from diarist.contract.options import TranscribeOptions
    from engine import Engine, EngineConfig
    from engine.loaders.registry import tiny_dummy_config
    from transcription.errors import Rejected
    from transcription.moss_td.pipeline import MossTdPipeline
    from transcription.transcriber import Transcriber

    eng = Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=tiny_dummy_config("moss-td"),
                              kv_budget_bytes=4 << 20, max_running_requests=2))
    tr = Transcriber(eng)
    assert isinstance(tr.pipeline, MossTdPipeline) and tr.frontend is Frontend.LIBROSA
    with pytest.raises(Rejected) as e:
        tr.transcribe(b"not even audio", TranscribeOptions(task="translate"))
    assert e.value.code == "unsupported_task" and "only transcribes" in e.value.message
