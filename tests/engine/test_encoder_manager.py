"""Encoder stage: a per-step window budget spreads a long recording over steps while decodes keep going,
windows of several requests share microbatches, a sequence joins prefill only when all its windows are
encoded, and the result equals encoding at admission (the previous path)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, FinishReason
from tests.conftest import noise, tiny_moss_engine
from transcription.moss_td.sequence import build_moss_sequence

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engine(budget: int, **kw) -> Engine:
    return tiny_moss_engine(max_context=8192, kv_budget_bytes=24 << 20, encoder_window_budget=budget, **kw)


def _seq(engine, wave, n):
    seq = build_moss_sequence(engine, wave, max_new_tokens=n)
    seq.stop_checker = None
    seq.stop_token_ids = ()
    return seq


LONG_S = 280.0  # 10 windows (9 full + 10 s)


@pytest.fixture(scope="module")
def at_admission():
    """Tokens of the short and the long request with the encoder run at admission (budget 0)."""
    eng = _engine(0)
    assert not eng.encoder.enabled
    short, long = _seq(eng, noise(8, 1), 40), _seq(eng, noise(LONG_S, 2), 6)
    eng.generate([short, long])
    return short.output_ids, long.output_ids


def test_long_recording_is_microbatched_while_a_decode_keeps_going(at_admission):
    eng = _engine(3, encoder_cache_entries=0)
    short = _seq(eng, noise(8, 1), 40)
    eng.submit(short)
    while len(short.output_ids) < 2:
        eng.step()
    assert eng.stats()["encoder_windows"] == 1
    long = _seq(eng, noise(LONG_S, 2), 6)
    eng.submit(long)
    per_step, tokens_during = [], 0
    while not long.prefill_done and long.num_computed == 0:
        before_w, before_t = eng.stats()["encoder_windows"], len(short.output_ids)
        eng.step()
        per_step.append(eng.stats()["encoder_windows"] - before_w)
        tokens_during += len(short.output_ids) - before_t
        if long.row is None:  # not admitted: still in the encoder stage, no KV held
            assert long.mm_state.get("embed_fn") is None and long not in eng.scheduler.waiting
    assert per_step == [3, 3, 3, 1]  # budget 3: ten windows over four steps, never more per step
    assert tokens_during == 4  # the running decode got one token in each of those steps
    assert long.timings.encoder_s > 0
    eng.run_until_done([short, long])
    assert (short.output_ids, long.output_ids) == at_admission
    assert eng.stats()["encoder_microbatches"] == 5 and eng.encoder.num_pending == 0
    assert eng.allocator.num_free == eng.allocator.num_slots


def test_windows_of_several_requests_share_a_microbatch(at_admission):
    eng = _engine(8, encoder_cache_entries=0)
    seqs = [_seq(eng, noise(8, 1), 40), _seq(eng, noise(LONG_S, 2), 6), _seq(eng, noise(20, 3), 4)]
    for s in seqs:
        eng.submit(s)
    eng.step()  # 1 + 7 windows in one microbatch; the short request starts prefill in the same step
    st = eng.stats()
    assert (st["encoder_windows"], st["encoder_microbatches"]) == (8, 1)
    assert seqs[0].num_computed > 0 and seqs[1].num_computed == 0 and seqs[1].row is None
    assert st["encoder_pending_requests"] == 2 and st["waiting_requests"] == 2
    eng.step()  # the long one's last 3 windows + the 20 s one: both complete, both are admitted
    assert eng.stats()["encoder_windows"] == 12 and eng.stats()["encoder_microbatches"] == 2
    assert seqs[1].row is not None and seqs[2].row is not None
    eng.run_until_done(seqs)
    assert (seqs[0].output_ids, seqs[1].output_ids) == at_admission


def test_embeddings_equal_one_pass_over_the_recording():
    """Microbatches cut the recording anywhere; its windows' outputs are concatenated per recording
    before the 4-frame merge, so the embeddings equal one pass over all windows."""
    eng = _engine(3, encoder_cache_entries=0)
    wave = noise(LONG_S, 2)
    got = []
    attach = eng.model.attach_audio
    eng.model.attach_audio = lambda seq, emb: (got.append(emb), attach(seq, emb))[1]
    eng.generate([_seq(eng, wave, 1)])
    ref = eng.model.audio_embeddings([torch.from_numpy(wave)])[0]
    assert got[0].shape == ref.shape == (9 * 375 + 125, 64)
    torch.testing.assert_close(got[0], ref, rtol=0, atol=1e-5)


def test_abort_while_encoding_frees_everything():
    eng = _engine(2)
    long = _seq(eng, noise(LONG_S, 4), 4)
    other = _seq(eng, noise(8, 5), 4)
    eng.submit(long)
    eng.step()  # two windows launched
    eng.submit(other)
    eng.abort(long)
    eng.run_until_done([long, other])
    assert long.finish_reason == FinishReason.ABORT and long.row is None and not long.output_ids
    assert other.finish_reason == FinishReason.LENGTH and len(other.output_ids) == 4
    assert eng.encoder.num_pending == 0 and not eng.encoder.has_work()
    assert eng.stats()["encoder_windows"] == 3  # the aborted recording stopped after its first microbatch
    assert eng.allocator.num_free == eng.allocator.num_slots and eng.table.num_free == eng.max_reqs


def test_failed_microbatch_ends_its_requests_not_the_engine(monkeypatch):
    eng = _engine(8, encoder_cache_entries=0)
    good_wave = noise(8, 6)
    real = eng.encoder._encode
    calls = {"n": 0}

    def flaky(x):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(x)

    monkeypatch.setattr(eng.encoder, "_encode", flaky)
    bad = _seq(eng, noise(40, 7), 4)
    eng.generate([bad])
    assert bad.finish_reason == FinishReason.ERROR and "out of memory" in bad.error
    ok = eng.generate([_seq(eng, good_wave, 4)])[0]
    assert ok.finish_reason == FinishReason.LENGTH and eng.encoder.num_pending == 0
    assert eng.allocator.num_free == eng.allocator.num_slots


def test_background_loop_waits_for_the_encoder():
    eng = _engine(1, encoder_cache_entries=0)  # one window per step: the loop must keep stepping
    eng.start()
    try:
        seq = eng.generate([_seq(eng, noise(100, 8), 3)])[0]  # 4 windows
    finally:
        eng.shutdown()
    assert seq.finish_reason == FinishReason.LENGTH and eng.stats()["encoder_windows"] == 4
