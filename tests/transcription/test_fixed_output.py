"""The transcriber's benchmark-only fixed output length: exact on dummy MOSS-TD weights, refused elsewhere."""

from __future__ import annotations

import pytest

from tests.conftest import noise, pcm16_wav, tiny_moss_engine
from transcription.transcriber import TranscribeOptions, Transcriber

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def moss():
    return tiny_moss_engine()




def _wav(seconds: float) -> bytes:
    return pcm16_wav((noise(seconds, 3) * 32767).astype("<i2"))


@pytest.mark.parametrize("tokens", [1, 7])
def test_every_sequence_decodes_exactly_the_fixed_length(moss, tokens):
    seen = []
    submit = moss.submit
    moss.submit = lambda seq: (seen.append(seq), submit(seq))[1]
    try:
        result = Transcriber(moss, fixed_output_tokens=tokens).transcribe(_wav(1.0), TranscribeOptions())
    finally:
        moss.submit = submit
    assert result.metrics.output_tokens == tokens and result.finish_reason == "length"
    (seq,) = seen
    assert seq.ignore_eos and seq.stop_checker is None and len(seq.output_ids) == tokens
    assert result.pipeline_metrics["audio_decode_s"] >= 0


def test_without_the_switch_the_request_path_is_unchanged(moss):
    seen = []
    submit = moss.submit
    moss.submit = lambda seq: (seen.append(seq), submit(seq))[1]
    try:
        Transcriber(moss).transcribe(_wav(1.0), TranscribeOptions(max_new_tokens=3))
    finally:
        moss.submit = submit
    (seq,) = seen
    assert not seq.ignore_eos and seq.stop_checker is not None and seq.max_new_tokens == 3


def test_refused_for_a_bad_count(moss):
    with pytest.raises(ValueError, match="dummy moss-td"):
        Transcriber(moss, fixed_output_tokens=0)


@pytest.mark.slow
def test_refused_on_real_weights(whisper_engine):
    with pytest.raises(ValueError, match="dummy moss-td"):
        Transcriber(whisper_engine, fixed_output_tokens=60)
