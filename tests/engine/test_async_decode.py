"""Async decode (one-step lookahead): same tokens as the synchronous loop, and no KV leak under churn; in
both loops, whole KV reservations partition the pool at every step and chunk boundaries change nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, FinishReason, Sequence
from engine.loaders.moss_td import TINY_DUMMY_CONFIG
from engine.overlap import PLACEHOLDER
from engine.request import Status
from transcription.moss_td.sequence import build_moss_sequence

CUDA = torch.cuda.is_available()
TINY = {  # vocab 512 keeps greedy ties improbable with random weights
    "text_config": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512},
    "audio_config": {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64},
    "init_std": 0.5,
}


def _engine(async_decode: bool, device: str = "cpu", max_reqs: int = 16, chunk: int = 64) -> Engine:
    gpu = device == "cuda"
    return Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY, device=device,
                               attention_backend="triton" if gpu else "torch", async_decode=async_decode,
                               kv_budget_bytes=32 << 20, max_running_requests=max_reqs, chunk_size=chunk, seed=7))


def _requests(seed: int) -> list[Sequence]:
    rng = random.Random(seed)
    out = []
    for i in range(24):
        prompt = [rng.randrange(512) for _ in range(rng.randrange(1, 90))]
        seq = Sequence(prompt_ids=prompt, max_new_tokens=rng.randrange(1, 30), tag=i)
        if i % 3 == 0:
            seq.stop_token_ids = tuple(rng.sample(range(512), 40))  # a stop token shows up now and then
        if i % 5 == 1:
            k = rng.randrange(1, 10)
            seq.stop_checker = lambda s, k=k: FinishReason.REPETITION if len(s.output_ids) >= k else None
        out.append(seq)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")])])
def test_async_equals_sync(device):
    sync, lookahead = _engine(False, device), _engine(True, device)
    a, b = _requests(0), _requests(0)
    sync.generate(a)
    lookahead.generate(b)
    reasons = set()
    for x, y in zip(a, b, strict=True):
        assert y.output_ids == x.output_ids, x.tag
        assert y.finish_reason == x.finish_reason, x.tag
        reasons.add(x.finish_reason)
    assert reasons == {FinishReason.STOP, FinishReason.LENGTH, FinishReason.REPETITION}
    assert lookahead.allocator.num_free == lookahead.allocator.num_slots
    assert lookahead.counters["decode_tokens"] == sync.counters["decode_tokens"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")])])
def test_async_no_kv_leak_with_random_aborts(device):
    """10,000 requests (2,000 on the CPU, for CI time) of random lengths, about 10% aborted at random
    moments (queued, prefilling or decoding, also while their last step is in flight): every KV slot and
    ``req_to_token`` row comes back."""
    eng = _engine(True, device, max_reqs=64, chunk=1024)
    free_slots, free_rows = eng.allocator.num_free, eng.table.num_free
    rng = random.Random(1)
    total = 10_000 if device == "cuda" else 2_000
    todo, live, finished, doom, step = total, [], [], {}, 0
    while todo or live:
        while todo and len(live) < 96:
            seq = Sequence(prompt_ids=[rng.randrange(512) for _ in range(rng.randrange(1, 24))],
                           max_new_tokens=rng.randrange(1, 9), stop_token_ids=(rng.randrange(512),))
            if rng.random() < 0.1:  # aborted 0..7 steps after submission, wherever it is by then
                doom[seq.id] = step + rng.randrange(8)
            eng.submit(seq)
            live.append(seq)
            todo -= 1
        for seq in live:
            if doom.get(seq.id) == step:
                eng.abort(seq)
        eng.step()
        step += 1
        finished += [s for s in live if s.finished]
        live = [s for s in live if not s.finished]
    while eng.step():
        pass
    assert len(finished) == total
    assert eng.allocator.num_free == free_slots and eng.table.num_free == free_rows
    assert not eng.scheduler.running and not eng.scheduler.waiting
    aborted = sum(s.finish_reason == FinishReason.ABORT for s in finished)
    assert total // 20 < aborted < total // 4
    for s in finished:
        assert PLACEHOLDER not in s.output_ids
        assert len(s.output_ids) <= s.max_new_tokens
        if s.finish_reason == FinishReason.LENGTH:
            assert len(s.output_ids) == s.max_new_tokens
        if s.finish_reason == FinishReason.STOP:
            assert s.output_ids[-1] in s.stop_token_ids


def test_async_batch_of_one():
    sync, lookahead = _engine(False), _engine(True)
    a = Sequence(prompt_ids=list(range(5, 40)), max_new_tokens=25)
    b = Sequence(prompt_ids=list(range(5, 40)), max_new_tokens=25)
    sync.generate([a])
    lookahead.generate([b])
    assert b.output_ids == a.output_ids and len(b.output_ids) == 25


def test_whisper_transcripts_async_equal_sync(whisper_engine):
    """Whisper's steps carry logits processors (timestamp rules), which async decode runs synchronously
    inside its loop; the transcripts must not change (async decode is the default on CUDA)."""
    from engine.loaders import LoadedModel
    from tests.conftest import data_file
    from transcription.transcriber import TranscribeOptions, Transcriber

    loaded = whisper_engine.loaded
    lookahead = Engine(EngineConfig(model="whisper", kv_budget_bytes=512 << 20, max_running_requests=24,
                                    async_decode=True),
                       loaded=LoadedModel(loaded.model, loaded.tokenizer, loaded.info))
    assert lookahead.loop.lookahead is not None
    opts = TranscribeOptions(diarize=False)
    for clip in ("en_jfk_inaugural/jfk.flac", "en_2spk_phonecall_pyannote_sample/sample.wav"):
        a = Transcriber(whisper_engine).transcribe(data_file(clip), opts)
        b = Transcriber(lookahead).transcribe(data_file(clip), opts)
        assert [(s.start, s.end, s.text) for s in b.segments] == \
            [(s.start, s.end, s.text) for s in a.segments]
        assert len(a.segments) >= 1 and b.finish_reason == a.finish_reason
    assert lookahead.allocator.num_free == lookahead.allocator.num_slots


# -- whole KV reservations under churn, both loops (MOSS-TD text and audio requests, encoder stage) ---
def _check_kv_accounting(eng: Engine) -> None:
    """Free slots and the running sequences' reservations partition ``1..num_slots`` exactly, and each
    running sequence's host ``kv_slots`` is its whole reservation and equals its device table row."""
    sch, al = eng.scheduler, eng.allocator
    held = [s.kv_slots for s in sch.running]
    every = np.concatenate([al._free[: al.num_free].numpy(), *held])
    assert al.num_free + sum(len(h) for h in held) == al.num_slots
    assert np.array_equal(np.sort(every), np.arange(1, al.num_slots + 1))
    for s in sch.running:
        assert len(s.kv_slots) == s.reserved == s.prompt_len + s.max_new_tokens
        assert np.array_equal(eng.table.table[s.row, : s.reserved].numpy(), s.kv_slots)
        assert s.num_computed <= s.reserved <= eng.max_context
    assert all(s.status == Status.RUNNING for s in sch.running)
    assert all(s.status == Status.WAITING and s.row is None and s.kv_slots is None for s in sch.waiting)


def _phase(eng: Engine, s: Sequence) -> str:
    if s in eng.encoder.job_of:
        return "encoding"
    if s in eng.scheduler.waiting:
        return "waiting"
    if s in eng.scheduler.running:
        return "decoding" if s.prefill_done else "prefilling"
    return "submitted"  # still in the inbox


def _moss_engine(async_decode: bool, **kw) -> Engine:
    """Tiny MOSS-TD with 400 KV slots (1 KiB each) for a 256-token context: requests wait for KV."""
    cfg = {"model": "moss-td", "load_format": "dummy", "dummy_config": TINY_DUMMY_CONFIG, "max_context": 256,
           "kv_budget_bytes": 400 * 1024, "max_running_requests": 6, "encoder_window_budget": 1,
           "encoder_cache_entries": 0, "async_decode": async_decode, "chunk_size": 8, "seed": 3}
    cfg.update(kw)
    return Engine(EngineConfig(**cfg))


PHASES = ("submitted", "encoding", "waiting", "prefilling", "decoding")


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("async_decode", [False, True])
def test_reservations_partition_the_pool_at_every_step(async_decode):
    """Text prompts ending exactly at chunk boundaries, of 1 token, budgets clamped to the context left,
    audio requests through the encoder stage, chunk sizes 1..16 changing every step, a pool too small for
    all, aborts of submitted/encoding/waiting/prefilling/decoding requests: after every step the KV
    accounting holds; unaborted requests give exactly the tokens they give alone."""
    eng = _moss_engine(async_decode)
    rng = random.Random(1)

    def wave(i: int) -> np.ndarray:  # distinct recordings: identical ones would share one encoder job
        return (0.1 * np.random.default_rng(i).standard_normal(16_000 * (1 + i % 3))).astype(np.float32)

    def make(i: int) -> Sequence:
        if i >= 47 or rng.random() < 0.3:  # the first three arrive together: two wait for the encoder
            s = build_moss_sequence(eng, wave(i), max_new_tokens=rng.randint(1, 12))
            s.stop_checker, s.tag = None, ("audio", i)
            return s
        c = eng.scheduler.chunk_size
        n = rng.choice([1, 2, c, 2 * c, 3 * c - 1, rng.randint(1, 60), rng.randint(240, 255), 255])
        return Sequence(prompt_ids=[rng.randrange(1, 150_000) for _ in range(n)], tag=("text",),
                        max_new_tokens=10_000 if n >= 240 else rng.choice([1, 2, rng.randint(1, 20)]),
                        stop_token_ids=(rng.randrange(150_000),))  # 10,000: clamped to the context left

    live, done, doom, aborted_in, todo, waited_for_kv = [], [], {}, set(), 50, False
    while todo or live:
        if todo and rng.random() < 0.4:  # bursts: with one window a step, some audio waits to encode
            for _ in range(3 if todo == 50 else min(todo, rng.randint(1, 4))):
                s = make(todo)
                eng.submit(s)
                live.append(s)
                todo -= 1
                if todo == 47 or rng.random() < 0.35:  # aborted once it reaches this phase, if it does
                    ph = "encoding" if todo == 47 else PHASES[len(doom) % 5]
                    doom[s.id] = "waiting" if ph == "encoding" and s.tag[0] == "text" else ph  # no encoder
        for s in live:
            if doom.get(s.id) == _phase(eng, s):
                aborted_in.add(doom[s.id])
                doom[s.id] = None
                eng.abort(s)
        eng.scheduler.chunk_size = rng.choice([1, 2, 3, 8, 16])
        eng.step()
        _check_kv_accounting(eng)
        sch = eng.scheduler
        waited_for_kv |= bool(sch.waiting and eng.table.num_free and len(sch.running) < sch.max_running
                              and eng.allocator.num_free < sch.kv_needed(sch.waiting[0]))
        done += [(s, s.finish_reason, len(s.output_ids)) for s in live if s.finished]
        live = [s for s in live if not s.finished]
    while eng.step():
        _check_kv_accounting(eng)
    assert all((s.finish_reason, len(s.output_ids)) == tuple(end) for s, *end in done)  # ended stays ended
    assert aborted_in == set(PHASES) and waited_for_kv  # a row was free, the KV was not
    assert eng.allocator.num_free == eng.allocator.num_slots and eng.table.num_free == eng.table.max_reqs
    alone = _moss_engine(False, chunk_size=4096, max_running_requests=1)
    kept = [s for s, reason, _ in done if reason != FinishReason.ABORT]
    clamped = [s.max_new_tokens for s in kept if s.prompt_len + s.max_new_tokens == eng.max_context]
    assert len(kept) >= 25 and len(clamped) >= 2 and 1 in clamped  # 1: a prompt of max_context - 1 tokens
    for s in kept:
        if s.tag[0] == "audio":
            ref = build_moss_sequence(alone, wave(s.tag[1]), max_new_tokens=s.max_new_tokens)
            ref.stop_checker = None
        else:
            ref = Sequence(prompt_ids=s.prompt_ids, max_new_tokens=s.max_new_tokens,
                           stop_token_ids=s.stop_token_ids)
        alone.generate([ref])
        assert (s.output_ids, s.finish_reason) == (ref.output_ids, ref.finish_reason), s.tag
        assert s.row is None and s.kv_slots is None


@pytest.mark.parametrize("async_decode", [False, True])
@pytest.mark.parametrize("chunk", [1, 4])
def test_prompts_ending_at_chunk_boundaries(async_decode, chunk):
    """Prompts of exactly one, two chunks, one token either side of three, and of one token, arriving
    together at a fixed chunk size: each gives the tokens it gives alone in one chunk."""
    eng = _moss_engine(async_decode, chunk_size=chunk)
    lens = [chunk, 2 * chunk, 3 * chunk - 1, 3 * chunk + 1, 1]
    seqs = [Sequence(prompt_ids=[(97 * i + 13 * j) % 150_000 + 1 for j in range(n)], max_new_tokens=5,
                     ignore_eos=True) for i, n in enumerate(lens)]
    eng.generate(seqs)
    alone = _moss_engine(False, chunk_size=4096, max_running_requests=1)
    for s in seqs:
        ref = alone.generate([Sequence(prompt_ids=s.prompt_ids, max_new_tokens=5, ignore_eos=True)])[0]
        assert s.output_ids == ref.output_ids and len(s.output_ids) == 5, s.prompt_len
    assert eng.allocator.num_free == eng.allocator.num_slots


@pytest.mark.parametrize("async_decode, batch_s", [(False, 0.0), (True, 0.0), (True, 0.02)])
def test_a_finished_event_sees_final_timings_and_events_arrive_on_the_waiting_thread(async_decode, batch_s):
    """With a loop thread: what a waiter reads when ``finished`` reaches it (the service stores it as the job's
    metrics) is what the engine holds once it is idle, and every event of an inboxed request is delivered on
    the thread that waits, in order (token events, then finished)."""
    import threading

    from engine.request import EventInbox

    e = _engine(async_decode)
    e.start()
    try:
        seqs, seen, threads, snap = _requests(11), {}, set(), {}
        inbox = EventInbox(batch_s=batch_s)

        def listener(s: Sequence, kind: str, payload) -> None:
            threads.add(threading.get_ident())
            seen.setdefault(s.tag, []).append(kind)
            if kind == "finished":
                t = s.timings
                snap[s.tag] = (t.encoder_s, t.prefill_s, t.decode_s, len(s.output_ids))

        for s in seqs:
            s.on_event, s.inbox = listener, inbox
            e.submit(s)
        e.run_until_done(seqs, timeout_s=120)
        e.run_until_done([], timeout_s=1)
    finally:
        e.shutdown()
    assert threads == {threading.get_ident()}
    for s in seqs:
        t = s.timings
        assert snap[s.tag] == (t.encoder_s, t.prefill_s, t.decode_s, len(s.output_ids)), s.tag
        kinds = seen[s.tag]
        assert kinds[-1] == "finished" and kinds.count("finished") == 1
        assert kinds.count("token") == len(s.output_ids)
