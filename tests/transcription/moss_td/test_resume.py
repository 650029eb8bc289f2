"""MOSS-TD after a loop: decoding resumes after the last complete segment, within the request's budget.

The tiny random-weight MOSS-TD is forced (a logits processor on the first sequence) to write one complete
segment and then loop on "[S01]yeah"; the real loop guard stops it, and the continuation runs unforced.
"""

from __future__ import annotations

import pytest
import torch

from engine import FinishReason
from tests.conftest import noise, tiny_moss_engine
from transcription.decode_quality import FALLBACK_SEED
from transcription.moss_td.resume import RESUME_TEMPERATURES, complete_prefix, resume_after_loops
from transcription.moss_td.sequence import build_moss_sequence, moss_guard, moss_result

pytestmark = pytest.mark.usefixtures("one_torch_thread")
GOOD = "[0.50][S01]Good morning.[2.00]"


@pytest.fixture(scope="module")
def engine():
    return tiny_moss_engine()




class Script:
    """Forces ``tokens`` in turn, then ``loop`` over and over."""

    def __init__(self, tokens: list[int], loop: list[int]) -> None:
        self.tokens, self.loop = tokens, loop

    def __call__(self, seq, logits: torch.Tensor) -> torch.Tensor:
        i = len(seq.output_ids)
        tok = self.tokens[i] if i < len(self.tokens) else self.loop[(i - len(self.tokens)) % len(self.loop)]
        forced = torch.full_like(logits, -float("inf"))
        forced[tok] = 0.0
        return forced


def test_complete_prefix_ends_at_the_last_closed_segment(engine):
    tok = engine.tokenizer
    ids = tok.encode(GOOD + "[2.40][S02]Hi, al")
    n = complete_prefix(tok, ids)
    assert tok.decode(ids[:n]).removesuffix("[") == GOOD
    assert complete_prefix(tok, tok.encode("[0.50][S01]Good mor")) == 0


def scripted_continuations(engine, monkeypatch, first, script: Script) -> list:
    """Continuations of ``first`` (longer prompt, same audio) get ``script``; returns them as submitted."""
    conts, submit = [], engine.submit

    def patched(seq):
        if len(seq.prompt_ids) > first.prompt_len:
            seq.logits_processor = script
            conts.append(seq)
        submit(seq)

    monkeypatch.setattr(engine, "submit", patched)
    return conts


def looping_first(engine, wave, budget: int):
    tok = engine.tokenizer
    seq = build_moss_sequence(engine, wave, max_new_tokens=budget)
    seq.logits_processor = Script(tok.encode(GOOD), tok.encode("[S01]yeah"))
    engine.generate([seq])
    assert seq.finish_reason == FinishReason.REPETITION
    return seq


def test_a_loop_resumes_after_the_last_complete_segment_within_the_budget(engine, monkeypatch):
    tok = engine.tokenizer
    wave = noise(10, 0)
    seq = looping_first(engine, wave, 200)
    n = complete_prefix(tok, seq.output_ids)
    rest = "[2.40][S02]Hi, all.[5.00]"[len(tok.decode(seq.output_ids[:n])) - len(GOOD):]
    conts = scripted_continuations(engine, monkeypatch, seq, Script([*tok.encode(rest), 151645], [151645]))
    r = resume_after_loops(engine, seq, wave, lambda: moss_guard(tok, 10.0))
    assert r.resumes == 1 and r.sequences == [seq, *conts] and r.finish_reason == FinishReason.STOP
    (cont,) = conts
    assert cont.prompt_ids == [*seq.prompt_ids, *seq.output_ids[:n]]  # the loop's text is not fed back
    assert cont.max_new_tokens == 200 - n and len(r.output_ids) <= 200
    assert cont.sampling.temperature == RESUME_TEMPERATURES[0] and cont.sampling.seed == FALLBACK_SEED
    assert cont.timings.encoder_s > 0  # the audio is encoded again for the new prompt
    res = moss_result(seq, tok, 10.0, r)
    assert res["segments"] == [{"speaker": "S01", "start": 0.5, "end": 2.0, "text": "Good morning."},
                               {"speaker": "S02", "start": 2.4, "end": 5.0, "text": "Hi, all."}]
    assert res["finish_reason"] == "stop" and res["repetition"] is None
    assert res["output_tokens"] == len(seq.output_ids) + len(cont.output_ids)
    assert engine.allocator.num_free == engine.allocator.num_slots


def test_a_loop_in_every_continuation_stops_after_the_last_temperature(engine, monkeypatch):
    tok = engine.tokenizer
    wave = noise(10, 0)
    seq = looping_first(engine, wave, 400)
    conts = scripted_continuations(engine, monkeypatch, seq, Script([], tok.encode("[S01]yeah")))
    r = resume_after_loops(engine, seq, wave, lambda: moss_guard(tok, 10.0))
    assert r.resumes == len(conts) == len(RESUME_TEMPERATURES)
    assert [c.sampling.temperature for c in conts] == list(RESUME_TEMPERATURES)
    assert r.finish_reason == FinishReason.REPETITION and r.repetition
    assert all(len(c.prompt_ids) == len(conts[0].prompt_ids) for c in conts)  # each resumes at the same cut
    res = moss_result(seq, tok, 10.0, r)
    assert res["segments"][0] == {"speaker": "S01", "start": 0.5, "end": 2.0, "text": "Good morning."}
