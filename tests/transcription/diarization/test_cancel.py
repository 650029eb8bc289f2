"""A cancel that comes while the speaker cascade runs stops it: the cascade polls ``should_cancel`` between
its stages and inside segmentation and embedding, and the transcriber reports the attempt as aborted (an
old cascade took no ``should_cancel`` and ran to the end: a job canceled after recognition still ran its
whole diarization)."""

from __future__ import annotations

import pytest

from tests.conftest import data_file
from transcription.audio import decode_audio
from transcription.audio.vad import detect_speech
from transcription.cancel import Canceled
from transcription.diarization import diarize, embedders, pipeline

PHONE = "en_2spk_phonecall_pyannote_sample/sample.wav"


@pytest.fixture(scope="module")
def phone():
    wave = decode_audio(data_file(PHONE)).mono
    return wave, detect_speech(wave)


class CountingEmbedder(embedders.CamPlusPlusEmbedder):
    """CAM++ that counts the x-vector batches it runs, and cancels the caller after ``cancel_after`` of them."""

    def __init__(self, cancel_after: int) -> None:
        super().__init__()
        self.batches, self.cancel_after = 0, cancel_after
        self.model.xvector.register_forward_pre_hook(lambda _module, _args: self._count())

    def _count(self) -> None:
        self.batches += 1

    def should_cancel(self) -> bool:
        return self.batches >= self.cancel_after


def test_a_cancel_during_embedding_stops_the_cascade(phone):
    wave, speech = phone
    whole = CountingEmbedder(cancel_after=10**9)
    assert diarize(wave, speech, embedder=whole)  # the recording gives turns when nobody cancels
    assert whole.batches >= 2  # more than one batch, so stopping after the first is a real stop

    stopped = CountingEmbedder(cancel_after=1)
    with pytest.raises(Canceled):
        diarize(wave, speech, embedder=stopped, should_cancel=stopped.should_cancel)
    assert stopped.batches == 1


def test_a_cancel_before_the_cascade_runs_nothing(phone):
    wave, speech = phone
    e = CountingEmbedder(cancel_after=0)
    with pytest.raises(Canceled):
        diarize(wave, speech, embedder=e, should_cancel=lambda: True)
    assert e.batches == 0


def test_transcriber_canceled_during_diarization_ends_aborted(whisper_engine, monkeypatch):
    """Cancel once recognition is done and the cascade has started: the result is ``abort`` with no turns,
    and the cascade stopped at its first poll (no embedding ran)."""
    from transcription.transcriber import Transcriber

    state = {"diarizing": False, "batches": 0}
    embed = embedders.CamPlusPlusEmbedder.embed

    def started(*args, **kwargs):
        state["diarizing"] = True
        return real_embed_locals(*args, **kwargs)

    def counted_embed(self, *args, **kwargs):
        state["batches"] += 1
        return embed(self, *args, **kwargs)

    real_embed_locals = pipeline._embed_local_speakers
    monkeypatch.setattr(pipeline, "_embed_local_speakers", started)
    monkeypatch.setattr(embedders.CamPlusPlusEmbedder, "embed", counted_embed)
    r = Transcriber(whisper_engine).transcribe(data_file(PHONE), should_cancel=lambda: state["diarizing"])
    assert state["diarizing"] and r.segments  # recognition finished, then the cascade began
    assert r.finish_reason == "abort" and r.incomplete and r.turns is None
    assert {s.speaker for s in r.segments} == {0}
    assert state["batches"] == 1  # embed was entered once and gave up before its first group
