"""Async decode (one-step lookahead): same tokens as the synchronous loop, and no KV leak under churn."""

from __future__ import annotations

import random

import pytest
import torch

from engine import Engine, EngineConfig, FinishReason, Sequence
from engine.overlap import PLACEHOLDER

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
    from engine.transcriber import TranscribeOptions, Transcriber
    from tests.conftest import data_file

    loaded = whisper_engine.loaded
    lookahead = Engine(EngineConfig(model="whisper", kv_budget_bytes=512 << 20, max_running_requests=24,
                                    async_decode=True),
                       loaded=LoadedModel(loaded.model, loaded.tokenizer, loaded.info))
    assert lookahead._overlap is not None
    opts = TranscribeOptions(diarize=False)
    for clip in ("en_jfk_inaugural/jfk.flac", "en_2spk_phonecall_pyannote_sample/sample.wav"):
        a = Transcriber(whisper_engine).transcribe(data_file(clip), opts)
        b = Transcriber(lookahead).transcribe(data_file(clip), opts)
        assert [(s["start"], s["end"], s["text"]) for s in b["segments"]] == \
            [(s["start"], s["end"], s["text"]) for s in a["segments"]]
        assert len(a["segments"]) >= 1 and b["finish_reason"] == a["finish_reason"]
    assert lookahead.allocator.num_free == lookahead.allocator.num_slots
