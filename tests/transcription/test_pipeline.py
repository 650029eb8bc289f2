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
