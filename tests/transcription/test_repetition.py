"""Loop guard: periodic tails and token-rate bounds end a sequence with finish_reason ``repetition``."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, FinishReason, Sequence
from engine.loaders import LoadedModel
from engine.loaders.moss_td import ASSET_TOKENIZER
from engine.tokenizer import TextTokenizer
from tests.conftest import data_file
from tests.transcription.scripted_model import EOS, ScriptedModel
from transcription.moss_td.parser import render_moss_td
from transcription.moss_td.sequence import TimestampProgress, _digit_class, build_moss_sequence, moss_result
from transcription.repetition import RepetitionGuard

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    return TextTokenizer(ASSET_TOKENIZER)


def _feed(guard: RepetitionGuard, tokens: list[int]) -> tuple[FinishReason | None, int]:
    """Feed tokens one at a time as the scheduler does; return (reason, tokens fed when it fired)."""
    seq = Sequence(prompt_ids=[1], max_new_tokens=len(tokens) + 1)
    for t in tokens:
        seq.output_ids.append(t)
        reason = guard(seq)
        if reason is not None:
            return reason, len(seq.output_ids)
    return None, len(seq.output_ids)


@pytest.mark.parametrize("period", [1, 3, 17, 64])
def test_periodic_tail_is_found_with_its_start(period):
    rng = random.Random(period)
    prefix = [rng.randrange(1000, 2000) for _ in range(50)]
    pattern = [rng.randrange(3000, 4000) for _ in range(period)]
    guard = RepetitionGuard(max_period=64, min_repeats=4, min_span=64)
    reason, n = _feed(guard, prefix + pattern * 100)
    assert reason == FinishReason.REPETITION
    assert guard.period == period and guard.loop_start == 50
    assert n == 50 + max(64, 4 * period)  # fired as soon as the tail covered the thresholds
    assert guard.kept_output(prefix + pattern * 100)[: n] == prefix + pattern


def test_short_or_varied_repeats_do_not_fire(tok):
    guard = RepetitionGuard(max_period=64, min_repeats=4, min_span=64)
    text = "No, no, no, no. " * 3 + "Ha ha ha ha ha. " + "Well, I think we should start with the figures."
    assert _feed(guard, tok.encode(text))[0] is None
    rng = random.Random(0)
    assert _feed(RepetitionGuard(), [rng.randrange(151_000) for _ in range(5000)])[0] is None


def test_real_transcripts_rendered_as_moss_output_do_not_fire(tok):
    stm = data_file("en_2spk_phonecall_pyannote_sample/sample.stm").read_text().splitlines()
    names: dict[str, str] = {}
    segs = []
    for line in stm:
        _, _, who, start, end, text = line.split(" ", 5)
        names.setdefault(who, f"S{len(names) + 1:02d}")
        segs.append({"speaker": names[who], "start": float(start), "end": float(end), "text": text})
    ids = tok.encode(render_moss_td(segs))
    guard = RepetitionGuard(30.0, canonical=_digit_class, progress_fn=TimestampProgress(tok))
    assert _feed(guard, ids) == (None, len(ids))


def test_timestamps_advancing_inside_a_loop_still_count_as_repeats(tok):
    # "[3.00][S02]ha[3.50][3.50][S02]ha[4.00]..." differs only in digits: a loop once digits are one class.
    loop = "".join(f"[{t:.2f}][S02]ha[{t + 0.5:.2f}]" for t in np.arange(3, 9, 0.5))
    text = "[0.52][S01]Hello there.[2.31]" + loop
    ids = tok.encode(text)
    assert _feed(RepetitionGuard(canonical=None), ids)[0] is None
    guard = RepetitionGuard(canonical=_digit_class)
    reason, n = _feed(guard, ids)
    assert reason == FinishReason.REPETITION and n < len(ids)
    assert tok.decode(guard.kept_output(ids)).startswith("[0.52][S01]Hello there.[2.31][3.00][S02]ha")


def test_rate_bound_by_duration_and_by_progress():
    rng = random.Random(1)
    varied = [rng.randrange(1000, 100_000) for _ in range(1000)]
    guard = RepetitionGuard(5.0, grace_tokens=100, max_tokens_per_audio_s=10)
    assert _feed(guard, varied) == (FinishReason.REPETITION, 151)  # > 100 + 10 * 5
    assert guard.period is None and guard.kept_output(varied[:151]) == varied[:151]
    progress = RepetitionGuard(60.0, grace_tokens=100, max_tokens_per_audio_s=10, progress_fn=lambda s: 2.0)
    assert _feed(progress, varied)[1] == 121  # > 100 + 10 * 2 s covered so far
    capped = RepetitionGuard(3.0, grace_tokens=100, max_tokens_per_audio_s=10, progress_fn=lambda s: 1e9)
    assert _feed(capped, varied)[1] == 131  # progress beyond the audio counts as the audio's end
    assert _feed(RepetitionGuard(None), varied)[0] is None
    no_stamps = RepetitionGuard(30.0, grace_tokens=100, max_tokens_per_audio_s=10, progress_fn=lambda s: None)
    assert _feed(no_stamps, varied)[1] == 401  # no timestamps seen: bounded by the whole duration


def test_timestamp_progress_reads_the_latest_time(tok):
    def run(text: str) -> list[float]:
        seq = Sequence(prompt_ids=[1], max_new_tokens=100)
        progress = TimestampProgress(tok)
        seen = []
        for t in tok.encode(text):
            seq.output_ids.append(t)
            seen.append(progress(seq))
        return seen

    seen = run("[0.52][S01]Hi there.[2.31][2.90][S02]Yes.[5.04][5.40][S01]x[laugh] y[12")
    assert seen[0] is None  # no timestamp yet
    assert sorted(set(seen[5:])) == [0.52, 2.31, 2.9, 5.04, 5.4]  # "[laugh]" and a cut-off "[12" ignored
    assert run("[1.00][S01]In 第[2024]年.")[-1] == 2024.0  # numbers in text count; capped at the duration


def test_engine_ends_a_laughter_loop_and_keeps_the_transcript(tok):
    script = tok.encode("[0.52][S01]Morning, shall we start?[2.31][2.90][S02]")
    laugh = tok.encode(" ha")
    prompt = [151644, 872, 198]
    model = ScriptedModel(len(prompt), script, laugh)
    engine = Engine(EngineConfig(kv_budget_bytes=8 << 20, max_running_requests=4),
                    loaded=LoadedModel(model=model, tokenizer=tok, info={"name": "scripted"}))
    guard = RepetitionGuard(60.0, canonical=_digit_class, progress_fn=TimestampProgress(tok))
    seq = Sequence(prompt_ids=prompt, max_new_tokens=5000, stop_token_ids=(EOS,), stop_checker=guard)
    engine.generate([seq])
    assert seq.finish_reason == FinishReason.REPETITION
    assert len(seq.output_ids) == len(script) + 64  # stopped at the guard, far below the budget
    res = moss_result(seq, tok, 60.0)
    assert res["finish_reason"] == "repetition" and "1-token pattern" in res["repetition"]
    assert res["text"] == "[0.52][S01]Morning, shall we start?[2.31][2.90][S02] ha"
    assert [(s["speaker"], s["start"], s["end"], s["text"]) for s in res["segments"]] == [
        ("S01", 0.52, 2.31, "Morning, shall we start?"), ("S02", 2.9, None, "ha")]
    assert res["coverage"] == pytest.approx(2.9 / 60)
    assert engine.allocator.num_free == engine.allocator.num_slots  # its KV went back at once


def test_dummy_moss_model_forced_to_loop_ends_with_repetition():
    tiny = {"text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
            "audio_config": {"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 4,
                                 "encoder_ffn_dim": 128}}
    engine = Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=tiny,
                                 kv_budget_bytes=16 << 20, max_running_requests=2))
    with torch.no_grad():  # a zero final norm makes every logit 0: greedy repeats token 0 forever
        engine.model.model.language_model.norm.weight.zero_()
    seq = build_moss_sequence(engine, np.zeros(16_000 * 20, dtype=np.float32))
    assert seq.max_new_tokens == 512
    engine.generate([seq])
    assert seq.finish_reason == FinishReason.REPETITION
    assert seq.output_ids == [0] * 64
    res = moss_result(seq, engine.tokenizer, 20.0)
    assert res["text"] == "!" and res["segments"] == [] and res["coverage"] == 0.0
