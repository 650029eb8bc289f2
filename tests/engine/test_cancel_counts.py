"""A cancel only lowers the engine's load (issue 33 item 12): an abort is not counted as a waiting request,
and a canceled recording submits no more windows.

Before the fix each ``abort`` went through the same inbox as the submissions and ``waiting_requests``
counted that inbox, so aborting the 12 sequences of a job (twice: the wait's cancel, then the window
decoder's) showed the waiting count rising from 8 to 32 until the loop drained; and the window decoder
submitted every window of its first run after a cancel that came while it started.
"""

from __future__ import annotations

import pytest
import torch

from engine import FinishReason, Sequence
from tests.conftest import data_file, pcm16_wav
from tests.engine.test_engine_scheduling import TINY_MEL, tiny_engine


def load(engine) -> int:
    s = engine.stats()
    return s["running_requests"] + s["waiting_requests"]


def test_aborts_never_raise_the_waiting_count_and_drain_in_one_step():
    eng = tiny_engine(max_running_requests=2)
    mel = torch.randn(*TINY_MEL)
    seqs = [Sequence(prompt_ids=[1, 2, 3], max_new_tokens=200, mm_inputs={"mel": mel}, ignore_eos=True)
            for _ in range(6)]
    for s in seqs:
        eng.submit(s)
    eng.step()
    before = load(eng)
    assert before == 6 and eng.stats()["running_requests"] > 0
    for _ in range(2):  # the engine's wait aborts them, then the window decoder does again
        for s in seqs:
            eng.abort(s)
        assert load(eng) <= before
    eng.step()
    assert load(eng) == 0 and eng.stats()["kv_tokens_used"] == 0
    assert all(s.finish_reason == FinishReason.ABORT for s in seqs)


def test_submitted_and_aborted_before_a_step_counts_once():
    eng = tiny_engine()
    s = Sequence(prompt_ids=[1, 2, 3], max_new_tokens=5, mm_inputs={"mel": torch.randn(*TINY_MEL)}, ignore_eos=True)
    eng.submit(s)
    eng.abort(s)
    assert load(eng) == 1
    eng.run_until_done([s])
    assert s.finish_reason == FinishReason.ABORT and load(eng) == 0


@pytest.mark.slow
def test_a_cancel_stops_window_submission(whisper_engine, monkeypatch, tmp_path):
    """Three windows that start after a silence (all submitted together); the cancel comes as the first is
    submitted: no other window reaches the engine."""
    import numpy as np

    from transcription.audio import decode_audio
    from transcription.transcriber import TranscribeOptions, Transcriber

    wave = decode_audio(data_file("en_ami_meeting_dev00_2spk/dev00.wav")).mono
    path = tmp_path / "three.wav"
    path.write_bytes(pcm16_wav(np.concatenate([wave, wave, wave])))
    tr = Transcriber(whisper_engine)
    monkeypatch.setattr(tr.pipeline, "_speech", lambda w, should_cancel=None: ([(0.0, 25.0), (30.0, 55.0),
                                                                                  (60.0, 85.0)], None))
    submitted: list[Sequence] = []
    real = whisper_engine.submit

    def submit(seq):
        submitted.append(seq)
        return real(seq)

    monkeypatch.setattr(whisper_engine, "submit", submit)
    r = tr.transcribe(path, TranscribeOptions(diarize=False),
                      should_cancel=lambda: bool(submitted))
    assert r.finish_reason == "abort"
    assert len(submitted) == 1
    assert all(s.finished for s in submitted) and load(whisper_engine) == 0
