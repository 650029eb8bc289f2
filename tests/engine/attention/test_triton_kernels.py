"""Triton attention kernels and backend vs the torch reference.

On a CUDA machine the kernels run compiled at large ragged shapes (``gpu`` marker). Without CUDA they run
under the Triton interpreter (``TRITON_INTERPRET=1``, numpy on the CPU) at tiny shapes, which checks the
indexing, masking, split and merge logic of the very same kernel source.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.engine.triton_interpret import CUDA, DEV, skip_unless_interpreted  # before any kernel module

# isort: split
from engine.attention.torch_ref import TorchReferenceBackend, reference_attention
from engine.attention.triton_backend import TritonBackend
from engine.attention.triton_ops import decode as decode_mod
from engine.attention.triton_ops import (
    decode_attention,
    decode_splits_for_fill,
    extend_attention,
    extend_tile,
)
from engine.kv import CrossKVPool, KVPool, ReqToTokenTable

skip_unless_interpreted(decode_mod._decode_stage1)
if not CUDA:
    from triton.runtime import interpreter as _interp

    # Triton <= 3.5's interpreter turns a scalar into int() of a 1-element array, which numpy >= 2.3
    # refuses; loops with run-time bounds need it. Patch only the interpreter's tensor index hook.
    _orig_patch = _interp._patch_lang_tensor

    def _patch_lang_tensor(tensor):
        _orig_patch(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

    _interp._patch_lang_tensor = _patch_lang_tensor

TOL = {torch.float32: 2e-5 if not CUDA else 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "non-finite output"
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def make_cache(lens: list[int], hkv: int, d: int, dtype: torch.dtype, gen: torch.Generator, spare: int = 7):
    """Random K/V pool with each sequence's slots scattered at random (fragmented pool), and its table.
    Sequence i uses row i+1. Returns k, v ``[S, hkv, d]``, table int32, rows int32 ``[B]``."""
    total = sum(lens) + spare
    k = torch.randn(total + 1, hkv, d, generator=gen, device=DEV).to(dtype)
    v = torch.randn(total + 1, hkv, d, generator=gen, device=DEV).to(dtype)
    perm = torch.randperm(total, generator=gen, device=DEV) + 1
    table = torch.zeros(len(lens) + 1, max(lens) + 3, dtype=torch.int32, device=DEV)
    off = 0
    for i, n in enumerate(lens):
        table[i + 1, :n] = perm[off : off + n].int()
        off += n
    rows = torch.arange(1, len(lens) + 1, dtype=torch.int32, device=DEV)
    return k, v, table, rows


def seq_kv(k, v, table, row: int, n: int):
    slots = table[row, :n].long()
    return k[slots], v[slots]


# -- decode ------------------------------------------------------------------------------------------
CPU_DECODE = [([1, 5, 70, 300], 4, 2, 16, torch.float32), ([33, 2, 129], 3, 3, 8, torch.float16)]
GPU_DECODE = [
    ([100_000], 16, 8, 128, torch.bfloat16),
    ([1, 2, 63, 64, 65, 255, 256, 257, 4096, 35_000] + [1000 + 37 * i for i in range(54)], 16, 8, 128,
     torch.bfloat16),
    ([35_000 + 997 * i for i in range(16)], 16, 8, 128, torch.bfloat16),
    ([1, 7, 448, 300], 6, 6, 64, torch.float32),
    ([3, 100, 448], 6, 6, 64, torch.float16),
]


def _decode_case(lens, hq, hkv, d, dtype, fill, max_splits, min_split, block_n):
    gen = torch.Generator(device=DEV).manual_seed(len(lens) * 1000 + hq)
    k, v, table, rows = make_cache(lens, hkv, d, dtype, gen)
    q = torch.randn(len(lens), hq, d, generator=gen, device=DEV).to(dtype)
    out = torch.full_like(q, float("nan"))
    seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
    scale = 1 / math.sqrt(d)
    po = torch.full((len(lens), hq, max_splits, d), 7.0, device=DEV)  # sentinels: one split writes no partials
    pl = torch.full((len(lens), hq, max_splits), 7.0, device=DEV)
    decode_attention(q, k, v, rows, seq, out, sm_scale=scale, table=table, fill_splits=fill,
                     max_splits=max_splits, min_split_tokens=min_split, block_n=block_n, part_o=po, part_lse=pl)
    assert (fill == 1) == bool((po == 7.0).all() and (pl == 7.0).all())
    for i, n in enumerate(lens):
        ks, vs = seq_kv(k, v, table, i + 1, n)
        ref = reference_attention(q[i : i + 1], ks, vs, n - 1, scale)
        assert rel_err(out[i : i + 1], ref) < TOL[dtype], (i, n)


@pytest.mark.skipif(CUDA, reason="interpreter cases run where CUDA is absent")
@pytest.mark.parametrize("lens,hq,hkv,d,dtype", CPU_DECODE)
def test_decode_interpreter(lens, hq, hkv, d, dtype):
    # fill 4 with 32-token splits: length 1 and 5 leave 3 empty splits, 300 uses all 4.
    _decode_case(lens, hq, hkv, d, dtype, fill=4, max_splits=8, min_split=32, block_n=16)
    # one split: stage 1 writes the output itself and stage 2 is not launched
    _decode_case(lens, hq, hkv, d, dtype, fill=1, max_splits=8, min_split=32, block_n=16)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("lens,hq,hkv,d,dtype", GPU_DECODE)
def test_decode_gpu(lens, hq, hkv, d, dtype):
    fill = decode_splits_for_fill(len(lens), hkv, 32)
    _decode_case(lens, hq, hkv, d, dtype, fill=fill, max_splits=32, min_split=256, block_n=64)
    _decode_case(lens, hq, hkv, d, dtype, fill=32, max_splits=32, min_split=64, block_n=64)  # many empty
    _decode_case(lens, hq, hkv, d, dtype, fill=1, max_splits=32, min_split=256, block_n=64)  # no stage 2


# -- extend ------------------------------------------------------------------------------------------
CPU_EXTEND = [([(0, 5), (69, 1), (260, 40), (0, 33)], 4, 2, 16, torch.float32),
              ([(5, 20), (0, 17), (40, 3)], 6, 2, 8, torch.float16)]
GPU_EXTEND = [
    ([(95_904, 4096)], 16, 8, 128, torch.bfloat16),
    ([(0, 4096)], 16, 8, 128, torch.bfloat16),
    ([(0, 1), (5, 1), (0, 600), (20_000, 333), (1234, 64), (7, 65), (0, 2)], 16, 8, 128, torch.bfloat16),
    ([(0, 4), (3, 220), (100, 1)], 6, 6, 64, torch.float32),
]


def extend_vs_reference(items, hq, d, dtype, gen, k, v, table, rows, spans, ref_kv=None, **kernel_kw) -> None:
    """Causal :func:`extend_attention` of ``items`` (``[(prefix, extended), ...]``; sequence i in row i + 1 of
    ``table`` over the cache ``k``/``v``) with random queries drawn from ``gen``, each query slice
    ``spans(extended)`` (``[(j0, j1), ...]``) held to the fp32 reference over ``ref_kv`` (default the cache)
    within ``TOL[dtype]``. ``kernel_kw`` goes to the kernel (tiles, warps, FP8 scales)."""
    lens = [p + e for p, e in items]
    exts = [e for _, e in items]
    qo = [0]
    for e in exts:
        qo.append(qo[-1] + e)
    q = torch.randn(qo[-1], hq, d, generator=gen, device=DEV).to(dtype)
    out = torch.full_like(q, float("nan"))
    as_t = lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)
    scale = 1 / math.sqrt(d)
    extend_attention(q, k, v, out, rows, as_t(lens), as_t(exts), as_t(qo[:-1]), max(exts), sm_scale=scale,
                     table=table, causal=True, **kernel_kw)
    rk, rv = ref_kv or (k, v)
    for i, (p, e) in enumerate(items):
        ks, vs = seq_kv(rk, rv, table, i + 1, p + e)
        for j0, j1 in spans(e):  # query slices keep the fp32 reference's score matrix small
            ref = reference_attention(q[qo[i] + j0 : qo[i] + j1], ks[: p + j1], vs[: p + j1], p + j0, scale)
            assert rel_err(out[qo[i] + j0 : qo[i] + j1], ref) < TOL[dtype], (i, p, e, j0)


def _extend_case(items, hq, hkv, d, dtype, block_m, block_n, check_rows: int | None = None,
                 num_warps: int | None = None):
    gen = torch.Generator(device=DEV).manual_seed(len(items) * 77 + d)
    k, v, table, rows = make_cache([p + e for p, e in items], hkv, d, dtype, gen)
    c = check_rows

    def spans(e: int) -> list[tuple[int, int]]:  # all of it, or its head, middle and tail
        return [(0, e)] if c is None or e <= c else [(0, c), (e // 2 - c // 2, e // 2 + c // 2), (e - c, e)]

    extend_vs_reference(items, hq, d, dtype, gen, k, v, table, rows, spans, block_m=block_m, block_n=block_n,
                        num_warps=num_warps)


@pytest.mark.skipif(CUDA, reason="interpreter cases run where CUDA is absent")
@pytest.mark.parametrize("items,hq,hkv,d,dtype", CPU_EXTEND)
def test_extend_interpreter(items, hq, hkv, d, dtype):
    _extend_case(items, hq, hkv, d, dtype, block_m=16, block_n=16)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("items,hq,hkv,d,dtype", GPU_EXTEND)
@pytest.mark.parametrize("block_m,warps", [(64, None), (128, 8)])
def test_extend_gpu(items, hq, hkv, d, dtype, block_m, warps):
    _extend_case(items, hq, hkv, d, dtype, block_m=block_m, block_n=64, check_rows=256, num_warps=warps)


def test_extend_tile_by_new_tokens():
    """Large prompt chunks take 128-query programs, everything smaller (and every step with the switch
    at 0) keeps 64; float32 keeps 64 at any size (its 128-query tile exceeds an SM's shared memory)."""
    assert extend_tile(4096) == (128, 8) and extend_tile(2048) == (128, 8)
    assert extend_tile(2047)[0] == 64 and extend_tile(1)[0] == 64
    assert extend_tile(4096, 0)[0] == 64
    assert extend_tile(4096, 1024) == (128, 8) and extend_tile(1500, 2048)[0] == 64
    assert extend_tile(4096, element_size=4)[0] == 64 and extend_tile(4096, element_size=2) == (128, 8)


def test_cross_direct_addressing():
    """Cross-attention rows ``[R, src, H, D]`` read directly (no table, no mask), decode and extend."""
    gen = torch.Generator(device=DEV).manual_seed(5)
    src, h, d = (1500, 6, 64) if CUDA else (40, 3, 8)
    ck = torch.randn(4, src, h, d, generator=gen, device=DEV)
    cv = torch.randn(4, src, h, d, generator=gen, device=DEV)
    kb, vb = ck.view(-1, h, d), cv.view(-1, h, d)
    rows = torch.tensor([3, 1], dtype=torch.int32, device=DEV)
    lens = torch.full((2,), src, dtype=torch.int32, device=DEV)
    q = torch.randn(2, h, d, generator=gen, device=DEV)
    out = torch.empty_like(q)
    decode_attention(q, kb, vb, rows, lens, out, sm_scale=d**-0.5, src_len=src, fill_splits=4, max_splits=8,
                     min_split_tokens=16, block_n=16)
    qe = torch.randn(5, h, d, generator=gen, device=DEV)
    oute = torch.empty_like(qe)
    qo = torch.tensor([0, 3], dtype=torch.int32, device=DEV)
    ext = torch.tensor([3, 2], dtype=torch.int32, device=DEV)
    extend_attention(qe, kb, vb, oute, rows, lens, ext, qo, 3, sm_scale=d**-0.5, src_len=src, causal=False,
                     block_m=16, block_n=16)
    out1 = torch.full_like(q, float("nan"))  # one split: stage 1 writes the output, no stage 2
    po, pl = torch.full((2, h, 8, d), 7.0, device=DEV), torch.full((2, h, 8), 7.0, device=DEV)
    decode_attention(q, kb, vb, rows, lens, out1, sm_scale=d**-0.5, src_len=src, fill_splits=1, max_splits=8,
                     min_split_tokens=16, block_n=16, part_o=po, part_lse=pl)
    assert bool((po == 7.0).all() and (pl == 7.0).all())
    for i, r in enumerate([3, 1]):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[i][:, None], ck[r].transpose(0, 1), cv[r].transpose(0, 1))[:, 0]
        assert rel_err(out[i], ref) < TOL[torch.float32] and rel_err(out1[i], ref) < TOL[torch.float32]
        qi = qe[int(qo[i]) : int(qo[i]) + int(ext[i])].transpose(0, 1)
        ref = torch.nn.functional.scaled_dot_product_attention(qi, ck[r].transpose(0, 1), cv[r].transpose(0, 1))
        assert rel_err(oute[int(qo[i]) : int(qo[i]) + int(ext[i])], ref.transpose(0, 1)) < TOL[torch.float32]


def test_fill_splits_heuristic():
    assert decode_splits_for_fill(1, 8, 64) == 64  # 8 programs per split: use every split
    assert decode_splits_for_fill(1, 8, 32) == 32
    assert decode_splits_for_fill(16, 8, 64) == 5  # ceil(4 x 132 / 128)
    assert decode_splits_for_fill(32, 8, 64) == 3  # 256 programs: below 2 per SM
    assert decode_splits_for_fill(33, 8, 64) == 1  # 264 = 2 x 132: one split, no stage 2
    assert decode_splits_for_fill(64, 8, 64) == 1
    assert decode_splits_for_fill(0, 8, 64) == 64
    assert decode_splits_for_fill(16, 8, 64, per_sm=2) == 3


def test_fill_splits_heuristic_without_single_split():
    assert decode_splits_for_fill(64, 8, 64, single_split_per_sm=0) == 2  # ceil(4 x 132 / 512)
    assert decode_splits_for_fill(200, 8, 64, single_split_per_sm=0) == 1


# -- backend -----------------------------------------------------------------------------------------
def _pools(n_layers, slots, hq, hkv, d, dtype, max_reqs, ctx, src, gen):
    kv = KVPool(n_layers, slots, hkv, d, dtype, DEV)
    cross = CrossKVPool(n_layers, max_reqs, src, hq, d, dtype, DEV)
    for t in kv.k + kv.v + cross.k + cross.v:
        t.copy_(torch.randn(t.shape, generator=gen, device=DEV).to(dtype))
    table = ReqToTokenTable(max_reqs, ctx, DEV)
    return kv, cross, table


def _clone(kv: KVPool) -> KVPool:
    other = KVPool(kv.num_layers, kv.num_slots, kv.num_kv_heads, kv.head_dim, kv.k[0].dtype, DEV)
    for a, b in zip(other.k + other.v, kv.k + kv.v, strict=True):
        a.copy_(b)
    return other


def mixed_step(table: ReqToTokenTable, items: list[tuple[int, int, int]], perm: torch.Tensor):
    """A step of ``items`` ``(row, prefix, new tokens)`` whose rows take consecutive runs of the slots
    ``perm`` in ``table``: decodes (one new token) and prefill chunks packed as the scheduler packs them."""
    from engine.attention.base import ForwardBatch

    off = 0
    for row, p, n in items:
        table.write(row, 0, perm[off : off + p + n])
        off += p + n
    prefix = torch.tensor([p for _, p, _ in items])
    ext = torch.tensor([n for _, _, n in items])
    qo = torch.cat([torch.zeros(1, dtype=torch.int64), ext.cumsum(0)])
    loc = torch.cat([table.table[r, p : p + n] for r, p, n in items]).long()
    t = int(qo[-1])
    return ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64, device=DEV), positions=torch.zeros(t, dtype=torch.int64),
        out_cache_loc=loc, req_rows=torch.tensor([r for r, _, _ in items]), prefix_lens=prefix, extend_lens=ext,
        seq_lens=prefix + ext, qo_indptr=qo, logits_indices=qo[1:] - 1)


@pytest.mark.parametrize("num_sms", [None, 1])
def test_backend_matches_reference_mixed_step_and_graph_metadata(num_sms):
    """One step with decodes and prefill chunks (self + cross attention), then a decode step through the
    static graph buffers with padded rows: both equal the reference backend; padding writes slot 0 only.
    ``num_sms=1`` makes every decode a single split (stage 1 writes the output, no stage 2)."""
    from engine.attention.base import ForwardBatch

    gen = torch.Generator(device=DEV).manual_seed(11)
    hq, hkv, d, src = (16, 8, 128, 1500) if CUDA else (4, 2, 16, 24)
    dtype = torch.bfloat16 if CUDA else torch.float32
    kv, cross, table = _pools(2, 4000, hq, hkv, d, dtype, 8, 1024, src, gen)
    perm = torch.randperm(4000, generator=torch.Generator().manual_seed(11)) + 1
    items = [(3, 40, 1), (5, 0, 17), (1, 90, 1), (7, 12, 30), (2, 1, 1)]  # (row, prefix, new)
    batch = mixed_step(table, items, perm)
    off, t = sum(p + n for _, p, n in items), batch.num_tokens
    ref_kv = _clone(kv)
    ref = TorchReferenceBackend(ref_kv, table, cross, sm_scale=d**-0.5)
    tri = TritonBackend(kv, table, cross, max_splits=8, min_split_tokens=16, num_sms=num_sms)
    q = torch.randn(t, hq, d, generator=gen, device=DEV).to(dtype)
    k = torch.randn(t, hkv, d, generator=gen, device=DEV).to(dtype)
    v = torch.randn(t, hkv, d, generator=gen, device=DEV).to(dtype)
    ref.prepare(batch)
    tri.prepare(batch)
    assert (tri.meta.fill == 1) == (num_sms == 1)
    for layer in (0, 1):
        assert rel_err(tri.forward(layer, q, k, v), ref.forward(layer, q, k, v)) < TOL[dtype]
        assert rel_err(tri.cross_forward(layer, q), ref.cross_forward(layer, q)) < TOL[dtype]
    assert torch.equal(kv.k[1], ref_kv.k[1]) and torch.equal(kv.v[0], ref_kv.v[0])

    # decode step of 3 live rows through the graph buffers, padded to 4
    dec = [(3, 41), (1, 91), (2, 2)]
    for row, n in dec:
        table.write(row, n - 1, perm[off : off + 1])
        off += 1
    rows = torch.tensor([r for r, _ in dec])
    seq = torch.tensor([n for _, n in dec])
    dloc = torch.stack([table.table[r, n - 1] for r, n in dec]).long()
    dbatch = ForwardBatch(
        input_ids=torch.zeros(3, dtype=torch.int64, device=DEV), positions=seq - 1, out_cache_loc=dloc,
        req_rows=rows, prefix_lens=seq - 1, extend_lens=torch.ones(3, dtype=torch.int64), seq_lens=seq,
        qo_indptr=torch.arange(4), logits_indices=torch.arange(3))
    tri.init_graph_capture(8)
    tri.prepare_for_capture(4)
    assert (tri.meta.fill == 1) == (num_sms == 1)
    tri.prepare_for_replay(dbatch, 4)
    ref.prepare(dbatch)
    q = torch.randn(4, hq, d, generator=gen, device=DEV).to(dtype)
    k = torch.randn(4, hkv, d, generator=gen, device=DEV).to(dtype)
    v = torch.randn(4, hkv, d, generator=gen, device=DEV).to(dtype)
    before = kv.k[0].clone()
    out = tri.forward(0, q, k, v)
    assert rel_err(out[:3], ref.forward(0, q[:3], k[:3], v[:3])) < TOL[dtype]
    assert rel_err(tri.cross_forward(0, q)[:3], ref.cross_forward(0, q[:3])) < TOL[dtype]
    changed = torch.nonzero((kv.k[0] != before).flatten(1).any(1)).flatten().tolist()
    assert sorted(changed) == sorted([0] + dloc.tolist())  # live slots and the dummy slot 0, nothing else
