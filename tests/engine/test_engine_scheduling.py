"""Continuous batching is exact, chunked prefill is exact, and no KV leaks under random aborts."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineConfig, FinishReason, RequestRejected, Sequence
from tests.conftest import data_file
from transcription.audio import log_mel_spectrogram  # torch only: collected on the GPU machine without PyAV
from transcription.whisper.decoding import WhisperTimestampRules, WhisperTokens, whisper_prompt

TINY = {"d_model": 64, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 2,
            "decoder_attention_heads": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
            "max_source_positions": 100}
TINY_MEL = (80, 200)  # 2 s of frames: the tiny encoder's 100 source positions


def tiny_engine(**kw) -> Engine:
    """Random-weight Whisper of tiny width: fast, and exercises the same code paths as tiny.en."""
    cfg = {"model": "whisper", "load_format": "dummy", "dummy_config": TINY, "kv_budget_bytes": 64 << 20,
               "max_running_requests": 16}
    cfg.update(kw)
    return Engine(EngineConfig(**cfg))


def whisper_seq(engine, mel, prompt_ids=None, **kw) -> Sequence:
    t = WhisperTokens.from_vocab(engine.model.config.vocab_size)
    info = engine.loaded.info["config"]
    rules = WhisperTimestampRules(t, info["suppress_ids"], info["suppress_ids_begin"])
    return Sequence(prompt_ids=whisper_prompt(t, prompt_ids), max_new_tokens=kw.pop("max_new_tokens", 200),
                    stop_token_ids=(t.eot,), mm_inputs={"mel": mel}, logits_processor=rules, **kw)


@pytest.fixture(scope="module")
def clips():
    """16 real windows of different lengths (0.8 s to 30 s) cut from the shared recordings."""
    srcs = ["en_2spk_phonecall_pyannote_sample/sample.wav", "en_jfk_inaugural/jfk.flac",
            "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav",
            "en_ami_headset_ES2011a_40-46s/ES2011a.Headset-0-40s-46s.wav"]
    from transcription.audio import decode_audio

    waves = [decode_audio(data_file(s)).mono for s in srcs]
    rng = random.Random(7)
    out = []
    for i in range(16):
        w = waves[i % len(waves)]
        n = min(len(w), rng.randint(12_800, 480_000))
        start = rng.randint(0, len(w) - n)
        out.append(log_mel_spectrogram(torch.from_numpy(w[start : start + n]))[0])
    return out


@pytest.mark.slow
def test_sixteen_staggered_requests_equal_each_alone(whisper_engine, clips):
    eng = whisper_engine
    alone = []
    for mel in clips:
        s = whisper_seq(eng, mel.clone())
        eng.generate([s])
        alone.append(s.output_ids)
    seqs = [whisper_seq(eng, mel.clone()) for mel in clips]
    # Staggered arrival: new requests join while earlier ones are mid-decode.
    for i, s in enumerate(seqs):
        eng.submit(s)
        for _ in range(i % 4):
            eng.step()
    eng.run_until_done(seqs)
    assert [s.output_ids for s in seqs] == alone
    assert all(s.finish_reason == FinishReason.STOP for s in seqs)
    assert eng.allocator.num_free == eng.allocator.num_slots and eng.table.num_free == eng.table.max_reqs


def first_logits(engine, mel, prompt_ids) -> torch.Tensor:
    got = []
    seq = whisper_seq(engine, mel.clone(), prompt_ids, max_new_tokens=1)
    rules = seq.logits_processor
    seq.logits_processor = lambda s, x: (got.append(x.clone()), rules(s, x))[1]
    engine.generate([seq])
    return got[0]


@pytest.mark.slow
def test_chunked_prefill_gives_the_same_logits(whisper_engine, clips):
    eng = whisper_engine
    prompt = eng.tokenizer.encode(" Diane and Sheila talk on the phone about New Jersey, Texas and Chicago." * 9)
    assert len(prompt) > 100
    ref = None
    saved = eng.scheduler.chunk_size
    try:
        for chunk in (1, 7, 64, 4096):
            eng.scheduler.chunk_size = chunk
            logits = first_logits(eng, clips[0], prompt)
            if ref is None:
                ref = logits
            else:
                assert (logits - ref).abs().max().item() <= 1e-4
    finally:
        eng.scheduler.chunk_size = saved


def _drive_random(engine: Engine, rng: random.Random, n_requests: int) -> None:
    mel = torch.randn(*TINY_MEL, generator=torch.Generator().manual_seed(1))
    vocab = engine.model.config.vocab_size
    live: list[Sequence] = []
    submitted = 0
    while submitted < n_requests or live:
        if submitted < n_requests and rng.random() < 0.6:
            for _ in range(rng.randint(1, 4)):
                if submitted >= n_requests:
                    break
                prompt = [rng.randrange(50257) for _ in range(rng.randint(1, 24))]
                s = Sequence(prompt_ids=prompt, max_new_tokens=rng.randint(1, 8), mm_inputs={"mel": mel},
                             stop_token_ids=(rng.randrange(vocab),), ignore_eos=rng.random() < 0.5)
                engine.submit(s)
                live.append(s)
                submitted += 1
        if live and rng.random() < 0.15:
            engine.abort(rng.choice(live))
        engine.scheduler.chunk_size = rng.choice([1, 3, 16, 64, 4096])
        engine.step()
        live = [s for s in live if not s.finished]
        for s in engine.scheduler.running:  # the host copy of a row's slots is what release will free
            assert s.reserved == len(s.kv_slots)
            assert torch.equal(torch.from_numpy(s.kv_slots), engine.table.table[s.row, : s.reserved].long())
    engine.scheduler.chunk_size = 4096


@pytest.fixture(scope="module")
def tiny():
    return tiny_engine()


def test_thousand_random_requests_with_aborts_leak_no_kv(tiny):
    rng = random.Random(1234)
    _drive_random(tiny, rng, 1000)
    assert tiny.allocator.num_free == tiny.allocator.num_slots
    free = tiny.allocator._free[: tiny.allocator.num_free].tolist()
    assert len(set(free)) == len(free) and 0 not in free  # no slot freed twice, the dummy slot never
    assert tiny.table.num_free == tiny.table.max_reqs
    assert not tiny.scheduler.running and not tiny.scheduler.waiting


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 60))
def test_property_no_kv_leak(tiny, seed, n):
    _drive_random(tiny, random.Random(seed), n)
    assert tiny.allocator.num_free == tiny.allocator.num_slots
    assert tiny.table.num_free == tiny.table.max_reqs


def test_request_larger_than_free_kv_waits_then_completes():
    eng = tiny_engine(kv_budget_bytes=None, max_running_requests=4)
    eng.allocator.__init__(300)  # a small pool: the first request holds most of it
    eng.scheduler.allocator = eng.allocator
    mel = torch.randn(*TINY_MEL)
    big = Sequence(prompt_ids=list(range(200)), max_new_tokens=50, mm_inputs={"mel": mel}, ignore_eos=True)
    second = Sequence(prompt_ids=list(range(100)), max_new_tokens=50, mm_inputs={"mel": mel}, ignore_eos=True)
    eng.submit(big)
    eng.submit(second)
    eng.step()
    assert big in eng.scheduler.running and second in eng.scheduler.waiting  # 250 + 150 > 300: waits
    eng.run_until_done([big, second])
    assert len(big.output_ids) == 50 and len(second.output_ids) == 50
    assert second.timings.admitted >= big.timings.finished
    with pytest.raises(RequestRejected) as e:
        eng.submit(Sequence(prompt_ids=list(range(290)), max_new_tokens=100, mm_inputs={"mel": mel}))
    assert e.value.code == "kv_capacity" and "KV" in e.value.message
    with pytest.raises(RequestRejected) as e:
        eng.submit(Sequence(prompt_ids=list(range(500)), max_new_tokens=1, mm_inputs={"mel": mel}))
    assert e.value.code == "too_long"
    after = Sequence(prompt_ids=[1, 2, 3], max_new_tokens=5, mm_inputs={"mel": mel}, ignore_eos=True)
    eng.generate([after])  # the engine keeps serving
    assert len(after.output_ids) == 5 and eng.allocator.num_free == 300


def test_budget_is_clamped_to_the_context_left(tiny):
    s = Sequence(prompt_ids=list(range(400)), max_new_tokens=10_000, mm_inputs={"mel": torch.randn(*TINY_MEL)},
                 ignore_eos=True)
    tiny.generate([s])
    assert s.max_new_tokens == tiny.max_context - 400 and len(s.output_ids) == 48
    assert s.finish_reason == FinishReason.LENGTH


def test_failed_step_ends_its_sequences_with_error_and_engine_survives(tiny):
    bad = Sequence(prompt_ids=[1, 2], max_new_tokens=4, mm_inputs={"mel": torch.randn(80, 10)})  # wrong shape
    tiny.generate([bad])
    assert bad.finish_reason == FinishReason.ERROR and bad.error
    ok = Sequence(prompt_ids=[1, 2], max_new_tokens=4, mm_inputs={"mel": torch.randn(*TINY_MEL)}, ignore_eos=True)
    tiny.generate([ok])
    assert len(ok.output_ids) == 4 and tiny.allocator.num_free == tiny.allocator.num_slots


def test_stats_report_queue_and_kv(tiny):
    s = Sequence(prompt_ids=[1, 2, 3], max_new_tokens=3, mm_inputs={"mel": torch.randn(*TINY_MEL)}, ignore_eos=True)
    tiny.generate([s])
    st_ = tiny.stats()
    for key in ("running_requests", "waiting_requests", "kv_tokens_used", "kv_tokens_total", "tokens_per_s",
                "steps_per_s", "steps"):
        assert key in st_
    assert st_["running_requests"] == 0 and st_["kv_tokens_used"] == 0 and st_["steps"] > 0


class _NoRepr(Sequence):
    """A sequence whose repr fails: the step loop must never format one (repr prints every field)."""

    def __repr__(self) -> str:
        raise AssertionError("repr(seq) called by the engine")


def test_finishing_and_aborting_never_format_the_sequence(tiny):
    """A failed ``deque.remove`` formats ``repr(x)`` into its error; ``Scheduler.finish`` once did that for
    every finished request (~4 ms each with a long output on the H200, benchmarks/results/archive/diag_wshort_h200_f8e3287.json)."""
    mel = torch.randn(*TINY_MEL)
    done = _NoRepr(prompt_ids=[1, 2, 3], max_new_tokens=6, mm_inputs={"mel": mel}, ignore_eos=True)
    aborted = _NoRepr(prompt_ids=[4, 5, 6], max_new_tokens=40, mm_inputs={"mel": mel}, ignore_eos=True)
    tiny.submit(done)
    tiny.submit(aborted)
    tiny.step()
    tiny.abort(aborted)
    tiny.run_until_done([done, aborted])
    assert len(done.output_ids) == 6 and aborted.finish_reason == FinishReason.ABORT
    assert tiny.allocator.num_free == tiny.allocator.num_slots


def test_empty_prompt_is_refused(tiny):
    """A prompt of no tokens has no position to sample its first token at: packed after another request,
    its logits index (its last new token) fell on that request's last token, and it silently got the
    other request's next token; alone, the step failed with an index error."""
    mel = torch.randn(*TINY_MEL)
    with pytest.raises(RequestRejected) as e:
        tiny.submit(Sequence(prompt_ids=[], max_new_tokens=3, mm_inputs={"mel": mel}))
    assert e.value.code == "too_short"
    assert not tiny.scheduler.waiting and tiny._inbox.empty()
