"""The reference backend over the token-indexed cache equals dense attention, at ragged shapes."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import ForwardBatch, TorchReferenceBackend
from engine.kv import KVPool, ReqToTokenTable, SlotAllocator


def dense_attention(q, k, v, prefix):
    """Textbook softmax(q k^T / sqrt(d)) v with an explicit loop over heads; q [n,Hq,D], k/v [S,Hkv,D]."""
    n, hq, d = q.shape
    group = hq // k.shape[1]
    out = torch.empty_like(q)
    for h in range(hq):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        scores = q[:, h].double() @ kh.T / math.sqrt(d)
        for j in range(n):
            scores[j, prefix + j + 1 :] = -math.inf
        out[:, h] = (torch.softmax(scores, -1) @ vh).to(q.dtype)
    return out


@pytest.mark.parametrize("hq,hkv,d", [(16, 8, 128), (6, 6, 64), (4, 1, 32)])
@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_batch_with_prefixes_and_decodes(hq, hkv, d, seed):
    g = torch.Generator().manual_seed(seed)
    # (prefix_len, extend_len): decodes, a fresh prefill, chunks over a cached prefix, length-1 context
    shapes = [(5, 1), (0, 7), (13, 4), (0, 1), (30, 1), (3, 9)]
    pool = KVPool(1, 200, hkv, d, torch.float32, "cpu")
    table = ReqToTokenTable(len(shapes), 64, "cpu")
    alloc = SlotAllocator(200)
    backend = TorchReferenceBackend(kv=pool, table=table)
    rows, kfull, vfull, slots_new = [], [], [], []
    for prefix, ext in shapes:
        row = table.alloc()
        slots = alloc.alloc(prefix + ext)
        table.write(row, 0, slots)
        k = torch.randn(prefix + ext, hkv, d, generator=g)
        v = torch.randn(prefix + ext, hkv, d, generator=g)
        pool.store(0, slots[:prefix], k[:prefix], v[:prefix])  # the cached prefix
        rows.append(row)
        kfull.append(k)
        vfull.append(v)
        slots_new.append(slots[prefix:])
    ext = torch.tensor([e for _, e in shapes])
    pre = torch.tensor([p for p, _ in shapes])
    qo = torch.zeros(len(shapes) + 1, dtype=torch.int64)
    qo[1:] = ext.cumsum(0)
    q = torch.randn(int(ext.sum()), hq, d, generator=g)
    k_new = torch.cat([k[p:] for k, (p, _) in zip(kfull, shapes)])
    v_new = torch.cat([v[p:] for v, (p, _) in zip(vfull, shapes)])
    batch = ForwardBatch(
        input_ids=torch.zeros(int(ext.sum()), dtype=torch.int64), positions=torch.zeros(int(ext.sum()), dtype=torch.int64),
        out_cache_loc=torch.cat(slots_new), req_rows=torch.tensor(rows), prefix_lens=pre, extend_lens=ext,
        seq_lens=pre + ext, qo_indptr=qo, logits_indices=qo[1:] - 1)
    backend.prepare(batch)
    out = backend.forward(0, q, k_new, v_new)
    for i, (p, e) in enumerate(shapes):
        want = dense_attention(q[qo[i] : qo[i + 1]], kfull[i], vfull[i], p)
        torch.testing.assert_close(out[qo[i] : qo[i + 1]], want, atol=2e-5, rtol=1e-5)
