"""Encoder output cache: waveform fingerprint, LRU eviction by entry count and by bytes, and the engine
serving a repeated recording from the cache (identical embeddings and tokens, cache on or off)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import Engine
from engine.encoder_cache import EncoderCache, audio_fingerprint
from tests.conftest import noise, tiny_moss_engine
from transcription.moss_td.sequence import build_moss_sequence

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _t(nbytes: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((nbytes // 4,), fill, dtype=torch.float32)


# -- fingerprint -------------------------------------------------------------------------------------------
def test_fingerprint_depends_on_every_sample_length_and_model():
    wave = noise(3, 0)
    key = audio_fingerprint(wave, "m")
    assert len(key) == 16
    assert audio_fingerprint(wave.copy(), "m") == key
    assert audio_fingerprint(torch.from_numpy(wave), "m") == key  # tensor or array: same bytes
    assert audio_fingerprint(wave.astype(np.float64), "m") == key  # hashed as float32
    other = wave.copy()
    other[-1] = np.nextafter(other[-1], np.float32(1))  # one ulp in the last sample
    assert audio_fingerprint(other, "m") != key
    assert audio_fingerprint(wave, "other-model") != key
    padded = np.concatenate([wave, np.zeros(1, np.float32)])  # a trailing zero is a different recording
    assert audio_fingerprint(padded, "m") != key


# -- LRU limits ----------------------------------------------------------------------------------------------
def test_evicts_least_recently_used_by_count():
    c = EncoderCache(max_entries=3, max_bytes=1 << 20)
    for k in b"abc":
        c.put(bytes([k]), _t(400, k))
    assert c.get(b"a") is not None  # a is now most recently used: b is the oldest
    c.put(b"d", _t(400))
    assert len(c) == 3 and b"b" not in c and {b"a", b"c", b"d"} == {k for k in (b"a", b"c", b"d") if k in c}
    assert c.evictions == 1 and c.bytes == 1200
    assert (c.hits, c.misses) == (1, 0)
    assert c.get(b"b") is None and c.misses == 1


def test_evicts_by_bytes_and_refuses_an_entry_larger_than_the_limit():
    c = EncoderCache(max_entries=64, max_bytes=1000)
    c.put(b"a", _t(400))
    c.put(b"b", _t(400))
    c.put(b"c", _t(400))  # 1200 > 1000: a goes
    assert b"a" not in c and len(c) == 2 and c.bytes == 800
    c.put(b"d", _t(800))  # needs both b and c gone
    assert [k for k in (b"b", b"c", b"d") if k in c] == [b"d"] and c.bytes == 800
    assert not c.put(b"huge", _t(1004))  # larger than the whole cache: not stored, nothing evicted
    assert b"d" in c and c.bytes == 800
    c.put(b"d", _t(200))  # replacing an entry re-counts its bytes
    assert c.bytes == 200 and len(c) == 1
    stats = c.stats()
    assert stats["encoder_cache_entries"] == 1 and stats["encoder_cache_bytes"] == 200


def test_resize_and_disabled_cache():
    c = EncoderCache(max_entries=4, max_bytes=1 << 20)
    for k in b"abcd":
        c.put(bytes([k]), _t(100))
    c.resize(max_entries=2)
    assert len(c) == 2 and b"c" in c and b"d" in c
    off = EncoderCache(max_entries=0, max_bytes=1 << 20)
    assert not off.enabled and not off.put(b"a", _t(4)) and off.get(b"a") is None
    with pytest.raises(ValueError):
        EncoderCache(max_entries=-1)


# -- through the engine ----------------------------------------------------------------------------------
def _engine(**kw) -> Engine:
    return tiny_moss_engine(**kw)


def _seq(engine, wave, n=24):
    seq = build_moss_sequence(engine, wave, max_new_tokens=n)
    seq.stop_checker = None  # fixed lengths: random weights would trip the loop guard at random points
    seq.stop_token_ids = ()
    return seq


def _record_embeddings(engine, monkeypatch) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    attach = engine.model.attach_audio

    def spy(seq, emb):
        seen.append(emb.clone())
        attach(seq, emb)

    monkeypatch.setattr(engine.model, "attach_audio", spy)
    return seen


def test_hit_skips_the_encoder_and_returns_identical_embeddings(monkeypatch):
    eng = _engine()
    seen = _record_embeddings(eng, monkeypatch)
    wave = noise(40, 1)  # two windows
    first = eng.generate([_seq(eng, wave)])[0]
    st = eng.stats()
    assert (st["encoder_cache_misses"], st["encoder_cache_hits"], st["encoder_windows"]) == (1, 0, 2)
    assert st["encoder_cache_entries"] == 1
    emb = seen[0]
    assert st["encoder_cache_bytes"] == emb.numel() * emb.element_size() == 500 * 64 * 4  # 500 tokens
    # the stored value is what the model computes for this recording in one go
    one_pass = eng.model.audio_embeddings([torch.from_numpy(wave)])[0]
    torch.testing.assert_close(emb, one_pass, rtol=0, atol=1e-5)
    second = eng.generate([_seq(eng, wave.copy())])[0]
    st = eng.stats()
    assert (st["encoder_cache_misses"], st["encoder_cache_hits"], st["encoder_windows"]) == (1, 1, 2)
    assert torch.equal(seen[1], emb)
    assert second.output_ids == first.output_ids and len(first.output_ids) == 24
    third = eng.generate([_seq(eng, noise(40, 2))])[0]  # other audio: a miss, other output
    assert eng.stats()["encoder_cache_misses"] == 2 and eng.stats()["encoder_windows"] == 4
    assert third.output_ids != first.output_ids
    assert eng.allocator.num_free == eng.allocator.num_slots


def test_concurrent_identical_requests_are_encoded_once(monkeypatch):
    eng = _engine()
    seen = _record_embeddings(eng, monkeypatch)
    wave = noise(35, 3)
    seqs = [_seq(eng, wave), _seq(eng, wave.copy()), _seq(eng, noise(35, 4))]
    eng.generate(seqs)
    st = eng.stats()
    assert st["encoder_windows"] == 4  # 2 distinct recordings x 2 windows
    assert st["encoder_dedup_hits"] == 1 and st["encoder_cache_misses"] == 2
    assert seqs[0].output_ids == seqs[1].output_ids != seqs[2].output_ids
    assert len(seen) == 3 and seen[0] is not None and torch.equal(seen[0], seen[1])


def test_tokens_identical_with_cache_on_and_off():
    waves = [noise(12, 5), noise(50, 6), noise(12, 5)]
    outs = {}
    for entries in (0, 64):
        eng = _engine(encoder_cache_entries=entries)
        a = eng.generate([_seq(eng, w) for w in waves])  # concurrent: the repeat dedups (cache on)
        b = eng.generate([_seq(eng, w) for w in waves])  # again: cache hits (cache on)
        outs[entries] = [s.output_ids for s in a + b]
        st = eng.stats()
        if entries:
            # first round: the repeat waits for its twin; second round: two hits, the repeat waits again
            assert (st["encoder_cache_hits"], st["encoder_dedup_hits"], st["encoder_windows"]) == (2, 2, 3)
        else:
            assert st["encoder_cache_hits"] == 0 and st["encoder_cache_entries"] == 0
            assert st["encoder_windows"] == 8  # every request encoded: (1 + 2 + 1) x 2
    assert outs[0] == outs[64]
    assert outs[0][0] == outs[0][2] == outs[0][3] and outs[0][0] != outs[0][1]


def test_cache_limits_hold_in_the_engine():
    eng = _engine(encoder_cache_entries=2)
    for seed in range(3):
        eng.generate([_seq(eng, noise(5, 10 + seed), n=2)])
    st = eng.stats()
    assert st["encoder_cache_entries"] == 2 and st["encoder_cache_evictions"] == 1
    assert st["encoder_cache_bytes"] == 2 * 63 * 64 * 4  # 5 s = 63 tokens of 64 float32 each
