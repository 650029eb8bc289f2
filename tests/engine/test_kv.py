"""KV pool, slot allocator and req_to_token table."""

from __future__ import annotations

import pytest
import torch

from engine.kv import KVPool, ReqToTokenTable, SlotAllocator
from engine.kv.allocator import OutOfSlots


def test_allocator_hands_out_distinct_nonzero_slots_and_takes_them_back():
    a = SlotAllocator(10)
    x = a.alloc(4)
    y = a.alloc(6)
    got = torch.cat([x, y]).tolist()
    assert sorted(got) == list(range(1, 11)) and a.num_free == 0
    with pytest.raises(OutOfSlots):
        a.alloc(1)
    a.free(x)
    assert a.num_free == 4
    with pytest.raises(RuntimeError):
        a.free(torch.arange(1, 12))  # more than were ever handed out


def test_table_rows_start_at_one_and_double_free_is_caught():
    t = ReqToTokenTable(max_reqs=3, max_context=8, device="cpu")
    rows = [t.alloc() for _ in range(3)]
    assert sorted(rows) == [1, 2, 3] and t.num_free == 0
    t.write(rows[0], 2, torch.tensor([7, 8, 9]))
    assert t.table[rows[0], :5].tolist() == [0, 0, 7, 8, 9]
    assert t.table[0].abs().sum() == 0  # the dummy row maps everything to the dummy slot
    t.free(rows[0])
    with pytest.raises(RuntimeError):
        t.free(rows[0])


def test_kv_bytes_per_token_matches_qwen3_06b_figure():
    # 28 layers x (K+V) x 8 kv heads x 128 dims x 2 bytes = 112 KiB
    assert KVPool.bytes_per_token(28, 8, 128, torch.bfloat16) == 112 * 1024


def test_store_writes_exactly_the_given_slots():
    p = KVPool(num_layers=2, num_slots=6, num_kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu")
    k = torch.randn(3, 2, 4)
    p.store(1, torch.tensor([5, 1, 3]), k, -k)
    assert torch.equal(p.k[1][[5, 1, 3]], k) and torch.equal(p.v[1][[5, 1, 3]], -k)
    assert p.k[1][[0, 2, 4, 6]].abs().sum() == 0 and p.k[0].abs().sum() == 0
