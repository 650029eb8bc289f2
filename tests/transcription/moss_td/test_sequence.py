"""MOSS-TD request pipeline: budgets, refusals, the dummy model end to end, and the result dict."""

from __future__ import annotations

import numpy as np
import pytest

from engine import FinishReason, RequestRejected, Sequence
from tests.conftest import tiny_moss_engine
from transcription.moss_td.sequence import build_moss_sequence, default_budget, moss_result
from transcription.repetition import RepetitionGuard

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine():
    """What ``--model moss-td --load-format dummy`` builds, at a tiny size, with a 2,048-token context."""
    return tiny_moss_engine()


def _noise(seconds: float, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 16_000))).astype(np.float32)


@pytest.mark.parametrize("seconds,budget", [
    (0.5, 512), (51.2, 512), (60, 600), (100.01, 1001), (5400, 54_000)])
def test_default_budget(seconds, budget):
    assert default_budget(seconds) == budget


def test_budget_default_explicit_and_clamped(engine):
    s = build_moss_sequence(engine, _noise(20))
    assert s.max_new_tokens == 512 and s.stop_token_ids == (151645,)
    assert s.mm_state["duration_s"] == 20.0 and s.mm_state["num_audio_tokens"] == 250
    assert build_moss_sequence(engine, _noise(20), max_new_tokens=7).max_new_tokens == 7
    long = build_moss_sequence(engine, _noise(120))  # default 1,200 tokens, but the context leaves fewer
    assert long.max_new_tokens == 2048 - long.prompt_len < 1200
    huge = build_moss_sequence(engine, _noise(120), max_new_tokens=10**6)
    assert huge.max_new_tokens == long.max_new_tokens


def test_prompt_that_leaves_no_room_is_too_long(engine):
    with pytest.raises(RequestRejected) as e:
        build_moss_sequence(engine, _noise(150))  # 2,133 prompt tokens > 2,048
    assert e.value.code == "too_long" and "2048-token context" in e.value.message


def test_dummy_model_end_to_end(engine):
    seqs = [build_moss_sequence(engine, _noise(s, s), max_new_tokens=40) for s in (3, 31)]
    engine.generate(seqs)
    for seq, seconds in zip(seqs, (3, 31), strict=True):
        res = moss_result(seq, engine.tokenizer, seconds)
        assert res["finish_reason"] in {"stop", "length", "repetition"}
        assert res["output_tokens"] == len(seq.output_ids) <= 40
        assert res["prompt_tokens"] == seq.prompt_len
        assert isinstance(res["text"], str) and isinstance(res["segments"], list)
        assert 0.0 <= res["coverage"] <= 1.0 and res["error"] is None
        assert seq.timings.encoder_s > 0 and seq.timings.first_token is not None
    assert engine.allocator.num_free == engine.allocator.num_slots


def test_canceled_before_start_submits_nothing(engine, monkeypatch):
    from transcription.moss_td.pipeline import transcribe_moss

    submitted: list[Sequence] = []
    monkeypatch.setattr(engine, "submit", submitted.append)
    res = transcribe_moss(engine, _noise(5), None, None, should_cancel=lambda: True)
    assert res["finish_reason"] == "abort" and res["segments"] == [] and res["duration"] == 5.0
    assert submitted == [] and engine.allocator.num_free == engine.allocator.num_slots


def test_result_parses_segments_clamps_ends_and_reports_coverage(engine):
    tok = engine.tokenizer
    seq = Sequence(prompt_ids=[1, 2, 3], max_new_tokens=100, stop_checker=RepetitionGuard(10.0))
    seq.output_ids = tok.encode("[0.50][S01]Good morning.[2.00][2.40][S02]Hi, all.[12.30]") + [151645]
    seq.finish_reason = FinishReason.STOP
    res = moss_result(seq, tok, 10.0)
    assert res["text"] == "[0.50][S01]Good morning.[2.00][2.40][S02]Hi, all.[12.30]"
    assert res["segments"] == [
        {"speaker": "S01", "start": 0.5, "end": 2.0, "text": "Good morning."},
        {"speaker": "S02", "start": 2.4, "end": 10.0, "text": "Hi, all."},  # 12.30 is past the audio
    ]
    assert res["finish_reason"] == "stop" and res["coverage"] == 1.0 and res["repetition"] is None
    seq.output_ids = tok.encode("[0.50][S01]Good morning.[2.00][2.40][S02]Hi")
    seq.finish_reason = FinishReason.LENGTH
    res = moss_result(seq, tok, 10.0)
    assert res["finish_reason"] == "length" and res["segments"][-1]["end"] is None
    assert res["coverage"] == pytest.approx(0.24)


def test_a_requested_temperature_samples_the_first_decode_seeded_and_resumes_hotter(engine, monkeypatch):
    """OpenAI's ``temperature`` is honoured (issue 33 item 7): the first decode samples at it with the fixed
    seed (the same file, the same transcript), loop resumes go on from there; unset stays greedy."""
    from engine.sampling import GREEDY, SamplingParams
    from transcription.decode_quality import FALLBACK_SEED
    from transcription.moss_td import pipeline

    assert build_moss_sequence(engine, _noise(3)).sampling == GREEDY
    seq = build_moss_sequence(engine, _noise(3), temperature=0.4)
    assert seq.sampling == SamplingParams(temperature=0.4, seed=FALLBACK_SEED)
    submitted, resumed = [], {}
    real_submit = engine.submit
    monkeypatch.setattr(engine, "submit", lambda s: (submitted.append(s), real_submit(s))[1])

    def fake_resume(eng, first, wave, make_guard, should_cancel=None, on_event=None, temperatures=()):
        resumed["temperatures"] = temperatures
        raise AssertionError("stop here")

    monkeypatch.setattr(pipeline, "resume_after_loops", fake_resume)

    class Opts:
        max_new_tokens, prompt, temperature = 24, None, 0.4

    try:
        res = pipeline.transcribe_moss(engine, _noise(3, 1), Opts(), None)
    except AssertionError:  # the sampled decode looped: the resume was asked for with the hotter ladder
        assert resumed["temperatures"] == (0.6, 0.8, 1.0)
    else:
        assert res["finish_reason"] in {"stop", "length"}
    assert submitted[0].sampling == SamplingParams(temperature=0.4, seed=FALLBACK_SEED)
