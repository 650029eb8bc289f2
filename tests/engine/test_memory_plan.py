"""Memory plan for MOSS-TD at full size: KV needed is known before admission; a 90-minute recording fits an
H200-sized KV budget and is refused with a clear error on one that cannot hold it.

The engine is built on the ``meta`` device (full 0.91 B shapes, bf16) so nothing big is allocated here.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import Engine, EngineConfig, FinishReason, RequestRejected, Sequence
from engine.models.moss_td_prompt import build_prompt
from transcription.moss_td_pipeline import build_moss_sequence

GiB = 1 << 30
H200_KV = int(0.85 * 137 * GiB)  # 0.85 of what is free on a 139 GiB H200 after 1.8 GB of bf16 weights
SR = 16_000


def _engine(kv_budget_bytes: int) -> Engine:
    return Engine(EngineConfig(model="moss-td", load_format="dummy", device="meta", dtype="bfloat16",
                               kv_budget_bytes=kv_budget_bytes, max_running_requests=16))


@pytest.fixture(scope="module")
def h200():
    return _engine(H200_KV)


@pytest.fixture(scope="module")
def wave90():
    return np.zeros(90 * 60 * SR, dtype=np.float32)  # calloc'd: pages are never touched


def test_kv_cost_per_token_is_112_kib(h200):
    assert h200.kv_bytes_per_token == 28 * 2 * 8 * 128 * 2 == 112 * 1024
    assert h200.max_context == 131_072


def test_90_minute_prompt_size(h200, wave90):
    template = len(build_prompt(h200.tokenizer, 1).ids) - 1  # one audio token, no marker
    seq = build_moss_sequence(h200, wave90, max_new_tokens=24_000)
    assert seq.prompt_ids.count(151671) == 67_500  # 180 windows x 375
    assert seq.prompt_len == 67_500 + 10_248 + template  # + 2 s marker digits
    assert 77_500 < seq.prompt_len < 78_500


def test_90_minutes_admitted_on_an_h200_budget(wave90):
    h200 = _engine(H200_KV)  # its own engine: meta tensors cannot be read back to release the slots
    seq = build_moss_sequence(h200, wave90, max_new_tokens=24_000)
    need = h200.kv_tokens_needed(seq)
    assert need == seq.prompt_len + 24_000
    assert 10.5 < need * h200.kv_bytes_per_token / GiB < 11.5  # ~11 GiB of bf16 KV
    assert h200.allocator.num_slots // need >= 10  # room for ten such meetings at once
    h200.submit(seq)
    h200._drain()
    batch = h200.scheduler.schedule()  # admission only; no forward runs on the meta device
    assert batch.admitted == [seq] and seq.reserved == need
    assert batch.items == [(seq, 4096)]  # the first prefill chunk
    # the whole reservation is taken at admission, so the sequence can never run out of KV mid-decode
    assert h200.allocator.num_free == h200.allocator.num_slots - need
    assert seq.num_allocated == need and len(seq.kv_slots) == need


def test_default_budget_fills_the_context_and_still_fits(h200, wave90):
    seq = build_moss_sequence(h200, wave90)  # max(512, 10 x 5400 s) = 54,000, clamped to the context left
    assert seq.max_new_tokens == 131_072 - seq.prompt_len
    assert h200.kv_tokens_needed(seq) == 131_072
    h200.submit(seq)
    h200.abort(seq)
    h200._drain()
    assert seq.finish_reason == FinishReason.ABORT


def test_90_minutes_refused_on_a_small_budget(wave90):
    small = _engine(8 * GiB)
    with pytest.raises(RequestRejected) as e:
        build_moss_sequence(small, wave90, max_new_tokens=24_000)
    assert e.value.code == "kv_capacity"
    msg = str(e.value)
    assert "101" in msg and "GiB" in msg and "8.00 GiB" in msg and "max_new_tokens" in msg
    # A sequence built without the pipeline is refused by the scheduler's own check at submit.
    raw = Sequence(prompt_ids=[0] * 77_800, max_new_tokens=24_000)
    with pytest.raises(RequestRejected) as e2:
        small.submit(raw)
    assert e2.value.code == "kv_capacity"
    assert not small.scheduler.waiting and small._inbox.empty()


def test_recording_too_long_for_the_context(h200):
    wave = np.zeros(170 * 60 * SR, dtype=np.float32)  # 170 min: about 147K prompt tokens
    with pytest.raises(RequestRejected) as e:
        build_moss_sequence(h200, wave)
    assert e.value.code == "too_long"
    assert "131072-token context" in str(e.value) and "min of audio fit" in str(e.value)


def test_empty_audio_is_refused(h200):
    with pytest.raises(RequestRejected) as e:
        build_moss_sequence(h200, np.zeros(0, dtype=np.float32))
    assert e.value.code == "too_short"
