"""Fused decoder kernels (engine/ops) vs their torch references, and fused weights vs separate ones.

With CUDA the kernels run compiled at decode and prefill shapes; without it they run under the Triton
interpreter (``TRITON_INTERPRET=1``) at small ragged shapes, which checks the same kernel source. The
references carry ``transformers``' rounding, so in float32 the kernels must agree to float32 rounding
and, on the GPU, in bfloat16 to within one bf16 step on a few elements (reduction order differs). The
interpreter casts to bfloat16 by truncation (numpy has no bf16), not round-to-nearest as the GPU does, so
there bf16 is held only to a relative error.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.triton_interpret import CUDA, DEV, skip_unless_interpreted  # before any kernel module

# isort: split
from engine.kv import KVDestination
from engine.ops import triton_kernels as tk
from engine.ops import triton_rope as tr
from engine.ops.activation import silu_and_mul_reference
from engine.ops.norm import layer_norm_reference, rms_norm_reference
from engine.ops.rotary import RotaryTable, apply_rotary, qk_norm_rope_reference

skip_unless_interpreted(tk._rms_norm_kernel)
DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 3, 16, 37] if CUDA else [1, 3]


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, cancels: bool = False) -> None:
    """``cancels``: the output is a difference of rounded products (rotary), so a one-step change in an
    input moves a small output by many of its own steps; hold it to a relative norm instead."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    elif not CUDA:
        rel = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert rel < 3e-2, rel  # up to six truncations of 2**-8 each
    elif cancels:
        rel = float((out.float() - ref.float()).norm() / ref.float().norm())
        # under one bf16 step (2**-8) of the whole vector. Against angles computed afresh (not the
        # table's rows) 14-21% of elements were one step off on an H200 (2026-11-29), so no count here.
        assert rel < 4e-3, rel
    else:  # at most one bf16 step apart, and on few elements
        diff = (out.float() - ref.float()).abs()
        step = ref.float().abs().clamp_min(1e-2) * 2 ** -7
        assert bool((diff <= step * 1.01).all()), float((diff / step).max())
        assert float((diff > 0).float().mean()) < 0.02


def _rand(*shape, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(DEV, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", [1024, 96])
def test_rms_norm_and_add(dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * 7 + hidden)
    x, r = _rand(rows, hidden, dtype=dtype, gen=g, scale=3.0), _rand(rows, hidden, dtype=dtype, gen=g)
    w = _rand(hidden, dtype=dtype, gen=g) + 1.0
    _close(tk.rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), dtype)
    out, s = tk.add_rms_norm(x, r, w, 1e-6)
    ref_s = r + x
    if CUDA or dtype == torch.float32:  # the residual add is exact: one rounding, as the reference
        torch.testing.assert_close(s, ref_s, rtol=0, atol=0)
    _close(out, rms_norm_reference(ref_s, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", [1024, 384, 96])
def test_layer_norm_and_add(dtype, rows, hidden):
    """Whisper's encoder widths (medium 1024, tiny 384) and a ragged one; the rows carry an offset so
    the mean matters, and the residual add is checked bit for bit."""
    g = torch.Generator().manual_seed(rows * 11 + hidden)
    x = _rand(rows, hidden, dtype=dtype, gen=g, scale=3.0) + 2.0
    r = _rand(rows, hidden, dtype=dtype, gen=g)
    w, b = _rand(hidden, dtype=dtype, gen=g) + 1.0, _rand(hidden, dtype=dtype, gen=g)
    _close(tk.layer_norm(x, w, b, 1e-5), layer_norm_reference(x, w, b, 1e-5), dtype)
    out, s = tk.add_layer_norm(x, r, w, b, 1e-5)
    ref_s = r + x
    torch.testing.assert_close(s, ref_s, rtol=0, atol=0)
    _close(out, layer_norm_reference(ref_s, w, b, 1e-5), dtype)
    # rows of a wider buffer (a strided [T, H] view) read through their row stride
    wide = torch.cat((x, x), dim=1)[:, :hidden]
    _close(tk.layer_norm(wide, w, b, 1e-5), layer_norm_reference(x, w, b, 1e-5), dtype)


def test_layer_norm_dispatch_keeps_shape():
    """The op entry points: ``[B, S, H]`` in, same shape out, on CUDA through the kernel, elsewhere
    through the reference (which is ``F.layer_norm`` itself)."""
    from engine.ops import add_layer_norm, layer_norm

    g = torch.Generator().manual_seed(5)
    x, r = _rand(2, 3, 64, dtype=torch.float32, gen=g), _rand(2, 3, 64, dtype=torch.float32, gen=g)
    w, b = _rand(64, dtype=torch.float32, gen=g), _rand(64, dtype=torch.float32, gen=g)
    out, s = add_layer_norm(x, r, w, b, 1e-5)
    assert out.shape == s.shape == (2, 3, 64) and torch.equal(s, r + x)
    ln = torch.nn.functional.layer_norm
    torch.testing.assert_close(out, ln(r + x, (64,), w, b, 1e-5), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer_norm(x, w, b, 1e-5), ln(x, (64,), w, b, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("inter", [3072, 40])
def test_silu_and_mul(dtype, rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    gu = _rand(rows, 2 * inter, dtype=dtype, gen=g, scale=4.0)
    _close(tk.silu_and_mul(gu), silu_and_mul_reference(gu), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("heads", [(16, 8, 128), (4, 2, 32), (6, 3, 64), (3, 1, 16)])  # (Hq, Hkv, D)
def test_qk_norm_rope(dtype, rows, heads):
    hq, hkv, d = heads
    g = torch.Generator().manual_seed(rows * 31 + d)
    qkv = _rand(rows, (hq + 2 * hkv) * d, dtype=dtype, gen=g, scale=2.0)
    qw, kw = _rand(d, dtype=dtype, gen=g) + 1.0, _rand(d, dtype=dtype, gen=g) + 1.0
    pos = torch.randint(0, 131_072, (rows,), generator=g).to(DEV)
    pos[0] = 0
    table = RotaryTable(d, 1e6, 131_072)
    cos, sin = table.get(DEV, dtype)
    q, k, v = tr.qk_norm_rope(qkv, pos, cos, sin, qw, kw, hq, hkv, 1e-6)
    rq, rk, rv = qk_norm_rope_reference(qkv, pos, 1e6, qw, kw, hq, hkv, 1e-6)
    _close(q, rq, dtype, cancels=True)
    _close(k, rk, dtype, cancels=True)
    assert torch.equal(v, rv)
    # against the same formula fed the kernel's own cos/sin table rows: every rounding step is the same
    tc, ts = torch.cat((cos[pos], cos[pos]), -1).float(), torch.cat((sin[pos], sin[pos]), -1).float()
    tq = apply_rotary(rms_norm_reference(qkv[:, :hq * d].reshape(rows, hq, d), qw, 1e-6), tc, ts)
    _close(q, tq, dtype)
    # the same kernel writing K/V straight into a pool at scattered slots
    slots = torch.randperm(2 * rows + 5, generator=g)[:rows].to(DEV) + 1
    kc = torch.full((2 * rows + 6, hkv, d), float("nan"), dtype=dtype, device=DEV)
    vc = kc.clone()
    q2, k2, v2 = tr.qk_norm_rope(qkv, pos, cos, sin, qw, kw, hq, hkv, 1e-6, kv_dest=KVDestination(kc, vc, slots))
    assert k2 is None and v2 is None and torch.equal(vc[slots], v)
    _close(q2, rq, dtype, cancels=True)  # a separately compiled variant: its float order may differ
    _close(kc[slots], rk, dtype, cancels=True)
    untouched = torch.ones(kc.shape[0], dtype=torch.bool, device=DEV)
    untouched[slots] = False
    assert torch.isnan(kc[untouched]).all() and torch.isnan(vc[untouched]).all()


def test_rotary_table_equals_direct_angles():
    from engine.ops.rotary import rotary_cos_sin

    pos = torch.tensor([0, 5, 4095, 78_000, 131_071], device=DEV)
    cos, sin = RotaryTable(128, 1e6, 131_072).get(DEV)
    rc, rs = rotary_cos_sin(pos, 128, 1e6)
    assert torch.equal(cos[pos], rc[:, :64]) and torch.equal(sin[pos], rs[:, :64])
    assert torch.equal(rc[:, :64], rc[:, 64:])  # the layout the kernel relies on


def test_bad_layouts_raise():
    x = torch.zeros(2, 8, device=DEV)
    with pytest.raises(ValueError, match="weight"):
        tk.rms_norm(x, torch.ones(8, dtype=torch.float64, device=DEV), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        tk.add_layer_norm(x, x, torch.ones(8, device=DEV), torch.ones(7, device=DEV), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        ones = torch.ones(8, device=DEV)
        tk.add_layer_norm(x, torch.zeros(3, 8, device=DEV), ones, ones, 1e-5)
    with pytest.raises(ValueError, match="heads"):
        tr.qk_norm_rope(torch.zeros(2, 10, device=DEV), torch.zeros(2, dtype=torch.int64, device=DEV),
                        x, x, torch.ones(4, device=DEV), torch.ones(4, device=DEV), 1, 1, 1e-6)


GEMV_SHAPES = ([(1, 1024, 4096), (2, 3072, 1024), (4, 2048, 1024), (3, 1024, 151_936), (8, 192, 77)]
               if CUDA else [(1, 192, 77), (3, 1024, 5), (2, 3072, 9)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", GEMV_SHAPES)
def test_gemv_matches_float64_product(dtype, shape):
    m, k, n = shape
    g = torch.Generator().manual_seed(m * 1000 + n)
    x, w = _rand(m, k, dtype=dtype, gen=g), _rand(n, k, dtype=dtype, gen=g, scale=0.05)
    out = tk.gemv(x, w)
    ref = (x.double() @ w.double().T)
    assert out.shape == (m, n) and out.dtype == dtype and torch.isfinite(out).all()
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < (5e-3 if dtype == torch.bfloat16 else 1e-5), rel


def test_gemv_tiles_and_supported_shapes():
    assert tk.gemv_tile(3072) == (1, 1) and tk.gemv_tile(2048) == (1, 1) and tk.gemv_tile(1024) == (2, 4)
    assert tk.gemv_supported(4, 3072) and not tk.gemv_supported(9, 1024) and not tk.gemv_supported(1, 100)
