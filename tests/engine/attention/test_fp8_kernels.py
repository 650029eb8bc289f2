"""FP8 (e4m3) KV cache in the Triton kernels vs the torch reference (engine/kv/fp8.py).

Compiled on CUDA at decode and prefill shapes (``gpu`` marker on the large ones), under the Triton
interpreter without it at small ragged shapes: the e4m3 rounding of the store kernel against torch's cast,
the fused q/k-norm + rotary + store kernel's codes and scales against :func:`engine.kv.fp8.quantize` of
the reference K/V, and decode / extend attention over FP8 codes against the reference over the
dequantised cache.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.engine.triton_interpret import CUDA, DEV, triton  # before any kernel module

# isort: split
import triton.language as tl

from engine.attention.torch_ref import TorchReferenceBackend, reference_attention
from engine.attention.triton_backend import TritonBackend
from engine.attention.triton_ops import (
    DecodeTile,
    decode_attention,
    decode_splits_for_fill,
    decode_tile,
)
from engine.kv import KVDestination, KVPool, ReqToTokenTable, fp8
from engine.ops import triton_rope
from engine.ops.rotary import RotaryTable, qk_norm_rope_reference
from tests.engine.attention.test_triton_kernels import (
    TOL,
    extend_vs_reference,
    make_cache,
    mixed_step,
    rel_err,
    seq_kv,
)


@triton.jit
def _codes_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0)
    tl.store(Y + offs, triton_rope._fp8_codes(x, 1.0, Y.dtype.element_ty), mask=m)


def test_e4m3_rounding_equals_torchs_cast():
    """Every finite e4m3 value, every midpoint between neighbours (ties go to the even code), points just
    off them, subnormals and zero: the kernel's codes are torch's round-to-nearest-even codes (a zero's sign
aside, which no product sees)."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].unique()  # -448 .. 448, 253 values (+-0 merged)
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([grid, mids, mids * (1 + 2**-20), mids * (1 - 2**-20), torch.tensor([447.9, -448.0, 1e-9])])
    x = x.to(DEV)
    y = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=DEV)
    _codes_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    ref = x.clamp(-448, 448).to(torch.float8_e4m3fn)
    bad = (y.float() != ref.float()).nonzero().flatten()  # codes equal as values (+0 == -0)
    assert bad.numel() == 0, list(zip(x[bad][:5].tolist(), y.float()[bad][:5].tolist(), ref.float()[bad][:5].tolist()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,heads", [(1, (16, 8, 128)), (5, (6, 3, 64)), (3, (3, 1, 16))] if CUDA
                         else [(3, (4, 2, 32)), (2, (3, 1, 16))])
def test_fused_store_writes_the_references_codes_and_scales(dtype, rows, heads):
    """The fused kernel's FP8 K/V at scattered slots vs :func:`fp8.quantize` of the reference's K/V:
    V bit for bit (the same bf16 inputs); K to the reference's own rounding (the kernel's K may be one
    activation step off on a few elements, which can move a code by one step)."""
    hq, hkv, d = heads
    g = torch.Generator().manual_seed(rows * 7 + d)
    qkv = (torch.randn(rows, (hq + 2 * hkv) * d, generator=g) * 2).to(dtype).to(DEV)
    qkv[:, -d:] = 0  # a zero V row: scale 1, zero codes
    qw = (torch.randn(d, generator=g) * 0.1 + 1).to(dtype).to(DEV)
    kw = (torch.randn(d, generator=g) * 0.1 + 1).to(dtype).to(DEV)
    pos = torch.randint(0, 4096, (rows,), generator=g).to(DEV)
    cos, sin = RotaryTable(d, 1e6, 4096).get(DEV, dtype)
    slots = (torch.randperm(3 * rows, generator=g)[:rows] + 1).to(DEV)
    pool = KVPool(1, 3 * rows, hkv, d, torch.float8_e4m3fn, DEV)
    _, k, v = triton_rope.qk_norm_rope(qkv, pos, cos, sin, qw, kw, hq, hkv, 1e-6,
                                       kv_dest=pool.destination(0, slots))
    assert k is None and v is None
    _, rk, rv = qk_norm_rope_reference(qkv, pos, 1e6, qw, kw, hq, hkv, 1e-6)
    kc, ks = fp8.quantize(rk)
    vc, vs = fp8.quantize(rv)
    got_vc = pool.v[0].view(torch.uint8)[slots]
    assert torch.equal(got_vc, vc.view(torch.uint8)) and torch.equal(pool.v_scale[0][slots], vs)
    assert bool((vs[:, -1] == 1).all()) and not bool(got_vc[:, -1].any())
    got_k, got_ks = pool.k[0].view(torch.uint8)[slots].view(torch.float8_e4m3fn), pool.k_scale[0][slots]
    torch.testing.assert_close(got_ks, ks, rtol=2**-7, atol=0)  # the amax moves by at most one step
    same = got_k.view(torch.uint8) == kc.view(torch.uint8)
    assert float(same.float().mean()) > 0.98  # a K one rounding off crosses a code boundary rarely
    err = (fp8.dequantize(got_k, got_ks) - rk.float()).abs()
    # half an e4m3 step (2**-4 relative, 2**-10 x scale below the normal range) plus one activation step
    bound = rk.float().abs() * (2**-4 + 2**-7) + ks[..., None] * 2**-9
    assert bool((err <= bound * 1.01).all()), float((err / bound).max())
    untouched = torch.ones(pool.num_slots + 1, dtype=torch.bool, device=DEV)
    untouched[slots] = False
    assert not bool(pool.k[0].view(torch.uint8)[untouched].any()) and bool((pool.k_scale[0][untouched] == 1).all())


def _quantized_cache(lens, hkv, d, gen):
    k, v, table, rows = make_cache(lens, hkv, d, torch.bfloat16, gen)
    kc, ks = fp8.quantize(k * 3)  # a scale well away from 1
    vc, vs = fp8.quantize(v)
    return kc, ks, vc, vs, table, rows


def _decode_fp8_case(lens, hq, hkv, d, dtype, fill, max_splits, min_split, block_n, **tile):
    gen = torch.Generator(device=DEV).manual_seed(len(lens) * 991 + hq)
    kc, ks, vc, vs, table, rows = _quantized_cache(lens, hkv, d, gen)
    q = torch.randn(len(lens), hq, d, generator=gen, device=DEV).to(dtype)
    out = torch.full_like(q, float("nan"))
    seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
    decode_attention(q, kc, vc, rows, seq, out, sm_scale=1 / math.sqrt(d), table=table, fill_splits=fill,
                     max_splits=max_splits, min_split_tokens=min_split, block_n=block_n, k_scale=ks, v_scale=vs,
                     **tile)
    kd, vd = fp8.dequantize(kc, ks), fp8.dequantize(vc, vs)
    for i, n in enumerate(lens):
        kk, vv = seq_kv(kd, vd, table, i + 1, n)
        ref = reference_attention(q[i : i + 1], kk, vv, n - 1, 1 / math.sqrt(d))
        assert rel_err(out[i : i + 1], ref) < TOL[dtype], (i, n)


def _extend_fp8_case(items, hq, hkv, d, dtype, block_m, block_n, check_rows=None):
    gen = torch.Generator(device=DEV).manual_seed(len(items) * 313 + d)
    kc, ks, vc, vs, table, rows = _quantized_cache([p + e for p, e in items], hkv, d, gen)
    c = check_rows

    def spans(e: int) -> list[tuple[int, int]]:  # all of it, or its head and tail
        return [(0, e)] if c is None or e <= c else [(0, c), (e - c, e)]

    extend_vs_reference(items, hq, d, dtype, gen, kc, vc, table, rows, spans,
                        ref_kv=(fp8.dequantize(kc, ks), fp8.dequantize(vc, vs)), block_m=block_m, block_n=block_n,
                        k_scale=ks, v_scale=vs)


@pytest.mark.skipif(CUDA, reason="interpreter cases run where CUDA is absent")
def test_fp8_decode_and_extend_interpreter():
    _decode_fp8_case([1, 5, 70, 300], 4, 2, 16, torch.float32, fill=4, max_splits=8, min_split=32, block_n=16)
    _decode_fp8_case([33, 2, 129], 3, 3, 8, torch.float32, fill=1, max_splits=8, min_split=32, block_n=16)
    _decode_fp8_case([1, 5, 70, 300], 4, 2, 16, torch.float16, fill=4, max_splits=8, min_split=32, block_n=16)
    _extend_fp8_case([(0, 5), (69, 1), (260, 40), (0, 33)], 4, 2, 16, torch.float32, block_m=16, block_n=16)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("lens", [[35_000], [90_000], [1, 2, 63, 65, 257, 4096] + [1000 + 37 * i for i in range(40)]])
@pytest.mark.parametrize("tile", [DecodeTile(), decode_tile(kv_fp8=True)])
def test_fp8_decode_gpu(lens, tile):
    fill = decode_splits_for_fill(len(lens), 8, 64)
    for f in (fill, 1):
        _decode_fp8_case(lens, 16, 8, 128, torch.bfloat16, fill=f, max_splits=64, min_split=256,
                         block_n=tile.block_n, num_warps=tile.num_warps, num_stages=tile.num_stages)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("block_m", [64, 128])
def test_fp8_extend_gpu(block_m):
    items = [(0, 1), (5, 1), (0, 600), (20_000, 333), (1234, 64), (7, 65), (30_000, 4096)]
    _extend_fp8_case(items, 16, 8, 128, torch.bfloat16, block_m=block_m, block_n=64, check_rows=256)


def test_backend_over_an_fp8_pool_matches_the_reference_backend():
    """One mixed step (decodes and prefill chunks) over the same FP8 pool: the Triton backend's output
    equals the reference backend's (which reads the dequantised cache), and both store identical codes."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    hq, hkv, d = (16, 8, 128) if CUDA else (4, 2, 16)
    dtype = torch.bfloat16 if CUDA else torch.float32
    pools = [KVPool(1, 600, hkv, d, torch.float8_e4m3fn, DEV) for _ in range(2)]
    init = torch.randn(601, hkv, d, generator=gen, device=DEV)
    for p in pools:
        p.store(0, torch.arange(601, device=DEV), init, -init)
    table = ReqToTokenTable(4, 256, DEV)
    items = [(1, 40, 1), (2, 0, 17), (3, 90, 30)]  # (row, prefix, new)
    batch = mixed_step(table, items, torch.randperm(600, generator=torch.Generator().manual_seed(3)) + 1)
    t = batch.num_tokens
    ref = TorchReferenceBackend(pools[0], table, sm_scale=d**-0.5)
    tri = TritonBackend(pools[1], table, max_splits=8, min_split_tokens=16)
    q = torch.randn(t, hq, d, generator=gen, device=DEV).to(dtype)
    k = torch.randn(t, hkv, d, generator=gen, device=DEV).to(dtype)
    v = torch.randn(t, hkv, d, generator=gen, device=DEV).to(dtype)
    ref.prepare(batch)
    tri.prepare(batch)
    assert rel_err(tri.forward(0, q, k, v), ref.forward(0, q, k, v)) < TOL[dtype]
    assert torch.equal(pools[0].k[0].view(torch.uint8), pools[1].k[0].view(torch.uint8))
    assert torch.equal(pools[0].v_scale[0], pools[1].v_scale[0])
    assert isinstance(tri.kv_destination(0), KVDestination) and tri.kv_destination(0).quantized
