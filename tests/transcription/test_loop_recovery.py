"""No silent loss after a decoding loop, on tiny.en and a real recording.

The loop is forced: a logits processor wrapped around the Whisper rules makes the chosen attempts say
" yeah, yeah, ..." after a few tokens, as greedy tiny.en did on an AMI excerpt (issue 21); the loop guard,
the quality checks and the fallback then run for real. The JFK clip is used because tiny.en transcribes it
without error, so any word the recovery loses shows.
"""

from __future__ import annotations

import re

import pytest
import torch

from diarist.transcript import Transcript
from tests.conftest import data_file
from transcription.decode_quality import LOOP, TEMPERATURES
from transcription.transcriber import TranscribeOptions, Transcriber

jiwer = pytest.importorskip("jiwer")
YEAH = (10194, 11)  # " yeah", ","
CLIP = "en_jfk_inaugural/jfk.flac"


def norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


class ForceLoop:
    """The Whisper rules, then " yeah," over and over once ``when(seq)`` holds (after ``after`` tokens)."""

    def __init__(self, rules, when, after: int = 6) -> None:
        self.rules, self.when, self.after = rules, when, after

    def __call__(self, seq, logits: torch.Tensor) -> torch.Tensor:
        x = self.rules(seq, logits)
        if len(seq.output_ids) >= self.after and self.when(seq):
            forced = torch.full_like(x, -float("inf"))
            forced[YEAH[len(seq.output_ids) % 2]] = 0.0
            return forced
        return x


@pytest.fixture()
def tr(whisper_engine):
    return Transcriber(whisper_engine)


def transcribe(tr: Transcriber, when, after: int = 6) -> dict:
    tr.pipeline.rules = ForceLoop(tr.pipeline.rules, when, after)
    return tr.transcribe(data_file(CLIP), TranscribeOptions(diarize=False))


def text_of(r: dict) -> str:
    return " ".join(s.text for s in r.segments)


@pytest.mark.slow
def test_a_greedy_loop_is_decoded_again_at_a_temperature(tr):
    ref = norm(data_file("en_jfk_inaugural/jfk.txt").read_text())
    r = transcribe(tr, lambda seq: seq.sampling.temperature == 0.0)
    (w,) = r.windows
    assert w["attempts"] >= 2 and w["temperature"] > 0 and w["status"] == "ok"
    assert jiwer.wer(ref, norm(text_of(r))) <= 0.1
    assert r.finish_reason == "stop" and not r.incomplete
    assert r.pipeline_metrics["decode_attempts"] == w["attempts"]


@pytest.mark.slow
def test_a_loop_at_every_temperature_resumes_after_the_last_good_segment(tr):
    """The first window loops after its first segment whatever the temperature; the rest of its audio is
    decoded as a new window from that segment's end, which does not loop."""
    ref = norm(data_file("en_jfk_inaugural/jfk.txt").read_text())

    def when(seq) -> bool:  # the recording's first window (its speech starts at 0.2 s), after a segment closed
        closed = sum(1 for t in seq.output_ids if t >= tr.pipeline.tokens.timestamp_begin) >= 2
        return seq.tag.start < 1.0 and closed

    r = transcribe(tr, when, after=0)
    a, b = r.windows[:2]
    assert a["attempts"] == len(TEMPERATURES) and a["end"] < 11.0 and b["start"] >= a["end"]
    assert b["status"] == "ok" and not r.incomplete
    assert jiwer.wer(ref, norm(text_of(r))) <= 0.1
    assert "yeah" not in norm(text_of(r))


@pytest.mark.slow
def test_a_window_that_always_loops_is_flagged_and_the_job_incomplete(tr):
    r = transcribe(tr, lambda seq: True)
    failed = [w for w in r.windows if w["status"] == "failed"]
    assert failed and all(w["flag"] == LOOP for w in failed)
    assert r.incomplete and "looped" in r.incomplete_reason and r.finish_reason == "repetition"
    assert r.segments and all(s.flags == [LOOP] for s in r.segments if s.start >= failed[0]["start"])
    t = Transcript.from_engine(r)
    assert t.incomplete and t.incomplete_reason == r.incomplete_reason
    assert any(s.flags == [LOOP] for s in t.segments)
