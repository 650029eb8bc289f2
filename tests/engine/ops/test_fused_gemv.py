"""GEMVs with a folded-in prologue (engine/ops/triton_fused.py) vs the unfused chain they replace.

Without CUDA the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``, set before the kernels
are decorated: :mod:`tests.engine.triton_interpret`) at small ragged shapes; with CUDA compiled, at
Qwen3-0.6B's shapes too. The oracle is the chain of torch references (:func:`rms_norm_reference` / :func:`silu_and_mul_reference`
rounding every intermediate to the dtype) followed by an exact (float64) product rounded once: the fused
kernel's float32 sum may land one step (ulp) away from that on a few elements, no more. The new residual
must be bit for bit the unfused ``residual + x``.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.engine.triton_interpret import CUDA, DEV, skip_unless_interpreted  # before any kernel module

# isort: split
from engine.ops import linear as ops_linear
from engine.ops import triton_fused as tf
from engine.ops import triton_kernels as tk
from engine.ops.activation import silu_and_mul_reference
from engine.ops.linear import LinearKernels, add_rms_norm_linear, add_rms_norm_swiglu_mlp
from engine.ops.norm import rms_norm_reference

skip_unless_interpreted(tf._norm_gemv_kernel)
HALF = [torch.bfloat16, torch.float16]
MANTISSA = {torch.bfloat16: 7, torch.float16: 10}
FUSED = LinearKernels(gemv_max_rows=1, fused_norm_gemv=True)
UNFUSED = LinearKernels(gemv_max_rows=1)


def _rand(*shape, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(DEV, dtype)


def _ulps(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|out - ref| in steps of the dtype at the larger of the two magnitudes, floored at 2**-7 of the
    vector's RMS: a dot product that cancels to near zero keeps float32's absolute error (K terms summed),
    which is many of its own float16 steps (as ``_close`` in test_fused_ops.py floors at 1e-2)."""
    floor = float(ref.double().pow(2).mean().sqrt()) * 2 ** -7
    big = torch.maximum(out.double().abs(), ref.double().abs()).clamp_min(max(floor, 1e-30))
    _, exp = torch.frexp(big)
    step = torch.ldexp(torch.ones_like(big), exp - 1 - MANTISSA[ref.dtype])
    return (out.double() - ref.double()).abs() / step


def _assert_one_step(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape and torch.isfinite(out).all()
    ulps = _ulps(out, ref)
    assert float(ulps.max()) <= 1.0, float(ulps.max())
    assert float((ulps > 0).double().mean()) <= 0.1, float((ulps > 0).double().mean())


def _exact_product(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (h.double() @ w.double().T).to(h.dtype)


NORM_SHAPES = [(64, 8), (192, 40), (1024, 40)] + ([(1024, 4096), (1024, 6144)] if CUDA else [])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("shape", NORM_SHAPES)  # (H, N): ragged, then Qwen3-0.6B's qkv and gate_up
def test_add_rms_norm_gemv_matches_the_unfused_chain(dtype, with_residual, shape):
    hidden, n = shape
    g = torch.Generator().manual_seed(hidden * 7 + n + with_residual)
    x, r = _rand(1, hidden, dtype=dtype, gen=g, scale=3.0), _rand(1, hidden, dtype=dtype, gen=g)
    nw = _rand(hidden, dtype=dtype, gen=g) + 1.0
    w = _rand(n, hidden, dtype=dtype, gen=g, scale=0.05)
    residual = r if with_residual else None
    out, s = tf.add_rms_norm_gemv(x, residual, nw, 1e-6, w)
    ref_s = r + x if with_residual else x
    assert torch.equal(s, ref_s)
    _assert_one_step(out, _exact_product(rms_norm_reference(ref_s, nw, 1e-6), w))
    # other tiles (a partial last program at N = 40 / 16) compute the same sums in the same order
    if n <= 64:
        for bn, warps in ((1, 1), (4, 2), (16, 4)):
            tiled, s2 = tf.add_rms_norm_gemv(x, residual, nw, 1e-6, w, block_n=bn, num_warps=warps)
            assert torch.equal(s2, ref_s)
            _assert_one_step(tiled, out)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", [(64, 16), (192, 80), (1024, 48)])  # (H, 2I)
def test_add_rms_norm_gemv_swiglu_matches_the_unfused_chain(dtype, shape):
    """SwiGLU in the gate/up kernel's epilogue: against SwiGLU (the reference) of the same kernel's plain
    gate/up output (same sums, so at most the exp's last bit differs), and against the whole reference chain
    (the gate and up products each one step from exact, so two steps)."""
    hidden, n2 = shape
    g = torch.Generator().manual_seed(hidden + n2)
    x, r = _rand(1, hidden, dtype=dtype, gen=g, scale=3.0), _rand(1, hidden, dtype=dtype, gen=g)
    nw = _rand(hidden, dtype=dtype, gen=g) + 1.0
    w = _rand(n2, hidden, dtype=dtype, gen=g, scale=0.2)
    a, s = tf.add_rms_norm_gemv_swiglu(x, r, nw, 1e-6, w)
    assert a.shape == (1, n2 // 2) and torch.equal(s, r + x)
    gate_up, _ = tf.add_rms_norm_gemv(x, r, nw, 1e-6, w)
    _assert_one_step(a, silu_and_mul_reference(gate_up))
    chain = silu_and_mul_reference(_exact_product(rms_norm_reference(r + x, nw, 1e-6), w))
    assert float(_ulps(a, chain).max()) <= 2.0
    a0, s0 = tf.add_rms_norm_gemv_swiglu(x, None, nw, 1e-6, w, block_n=8, num_warps=2)
    assert s0 is x
    _assert_one_step(a0, silu_and_mul_reference(tf.add_rms_norm_gemv(x, None, nw, 1e-6, w)[0]))


def test_bad_shapes_and_layouts_raise():
    x = torch.zeros(1, 64, dtype=torch.bfloat16, device=DEV)
    w = torch.zeros(8, 64, dtype=torch.bfloat16, device=DEV)
    nw = torch.ones(64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="one half-precision row"):
        tf.add_rms_norm_gemv(torch.zeros(2, 64, dtype=torch.bfloat16, device=DEV), None, nw, 1e-6, w)
    with pytest.raises(ValueError, match="one half-precision row"):
        tf.add_rms_norm_gemv(x.float(), None, nw.float(), 1e-6, w.float())
    with pytest.raises(ValueError, match="norm weight"):
        tf.add_rms_norm_gemv(x, None, nw[:32], 1e-6, w)
    with pytest.raises(ValueError, match="residual"):
        tf.add_rms_norm_gemv(x, x.half(), nw, 1e-6, w)
    with pytest.raises(ValueError, match="powers of two"):
        tf.add_rms_norm_gemv(x, None, nw, 1e-6, w, block_n=3)
    with pytest.raises(ValueError, match="even row count"):
        tf.add_rms_norm_gemv_swiglu(x, None, nw, 1e-6, w[:7])
    with pytest.raises(ValueError, match="K = 32"):
        tf.add_rms_norm_gemv(x[:, :32], None, nw[:32], 1e-6, w[:, :32])  # K = 32 is not a multiple of 64
    assert tf.fused_gemv_supported(1, 1024) and not tf.fused_gemv_supported(2, 1024)
    assert not tf.fused_gemv_supported(1, 96) and tf.fused_gemv_tile(192) == tk.gemv_tile(192)


# Compiles (does not run) the kernels for an H100/H200 (sm_90) in a fresh process: the interpreter is laxer
# than the compiler (globals, block shapes, constexpr branches), and ptxas ships in the Triton wheel.
_COMPILE_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.ops import triton_fused as tf

SCALARS = {"N": "i32", "stride_wn": "i32", "eps": "fp32"}

def build(kernel, dt, warps, **const):
    sig = {name: "constexpr" if name in const else SCALARS.get(name, "*" + dt) for name in kernel.arg_names}
    triton.compile(ASTSource(kernel, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})

for dt in ("bf16", "fp16"):
    for has_res in (True, False):
        for glu in (False, True):
            bn, warps = tf.fused_gemv_tile(1024, glu)
            build(tf._norm_gemv_kernel, dt, warps, HP=1024, KB=1024, CHUNKS=1, BN=bn, HAS_RES=has_res, GLU=glu)
print("compiled")
"""


@pytest.mark.skipif(CUDA, reason="with CUDA the kernels above run compiled")
def test_kernels_compile_for_hopper():
    """Qwen3-0.6B's shapes at the default tiles, bf16 and float16, every constexpr branch."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia", reason="Triton without its CUDA backend")
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[3])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the fused kernels' launches through the dispatch (which looks them up on the module)."""
    calls = []
    for name in ("add_rms_norm_gemv", "add_rms_norm_gemv_swiglu"):
        real = getattr(tf, name)
        monkeypatch.setattr(tf, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    return calls


def _dispatch_both(x, r, nw, w_in, w_gu, w_down, choice):
    """The two fused entries of a decoder layer: the q/k/v projection and the MLP block."""
    return (add_rms_norm_linear(x, r, nw, 1e-6, w_in, choice),
            add_rms_norm_swiglu_mlp(x, r if r is not None else x, nw, 1e-6, w_gu, w_down, choice))


def test_cpu_dispatch_is_the_unfused_chain(fused_calls):
    """CPU tensors never reach a kernel, whatever the choice: the exact reference chain (float32 here, as
    the CPU engine runs, and bf16)."""
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        x, r = torch.randn(1, 64, generator=g).to(dtype), torch.randn(1, 64, generator=g).to(dtype)
        nw, w = torch.randn(64, generator=g).to(dtype), torch.randn(16, 64, generator=g).to(dtype)
        gu_w, down_w = torch.randn(128, 64, generator=g).to(dtype), torch.randn(64, 64, generator=g).to(dtype)
        (y, s), (out, s1) = _dispatch_both(x, r, nw, w, gu_w, down_w, FUSED)
        assert torch.equal(s, r + x)
        assert torch.equal(y, torch.nn.functional.linear(rms_norm_reference(r + x, nw, 1e-6), w))
        y0, s0 = add_rms_norm_linear(x, None, nw, 1e-6, w, FUSED)
        assert s0 is x and torch.equal(y0, torch.nn.functional.linear(rms_norm_reference(x, nw, 1e-6), w))
        want = torch.nn.functional.linear(
            silu_and_mul_reference(torch.nn.functional.linear(rms_norm_reference(r + x, nw, 1e-6), gu_w)), down_w)
        assert torch.equal(s1, r + x) and torch.equal(out, want)
    assert fused_calls == []


needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("with_residual", [True, False])
def test_gpu_dispatch_fused_equals_unfused_at_qwen3_shapes(fused_calls, dtype, with_residual):
    """Qwen3-0.6B's qkv (4096 x 1024) and MLP block (gate_up 6144 x 1024, down 1024 x 3072) at one row: the
    fused dispatch against the unfused one (our add + RMSNorm and SwiGLU kernels around the GEMVs)."""
    g = torch.Generator().manual_seed(11)
    x, r = _rand(1, 1024, dtype=dtype, gen=g, scale=3.0), _rand(1, 1024, dtype=dtype, gen=g)
    nw = _rand(1024, dtype=dtype, gen=g) + 1.0
    r = r if with_residual else None
    w = _rand(4096, 1024, dtype=dtype, gen=g, scale=0.05)
    w_gu = _rand(6144, 1024, dtype=dtype, gen=g, scale=0.05)
    wd = _rand(1024, 3072, dtype=dtype, gen=g, scale=0.03)
    (y, s), (out, s1) = _dispatch_both(x, r, nw, w, w_gu, wd, FUSED)
    (y_ref, s_ref), (out_ref, s1_ref) = _dispatch_both(x, r, nw, w, w_gu, wd, UNFUSED)
    assert torch.equal(s, s_ref) and torch.equal(s1, s1_ref)
    _assert_one_step(y, y_ref)
    rel = float((out.float() - out_ref.float()).norm() / out_ref.float().norm())
    assert rel < 2 ** -8, rel  # a few gate/up elements one step apart, summed over 3072
    assert fused_calls == ["add_rms_norm_gemv", "add_rms_norm_gemv_swiglu"]


@pytest.mark.gpu
@needs_cuda
def test_gpu_dispatch_falls_back_beyond_the_gemv_rows(fused_calls):
    """Two rows (a prompt, or batch 2) and float32 take the unfused chain even with the fusion on."""
    g = torch.Generator().manual_seed(12)
    for rows, dtype in ((2, torch.bfloat16), (1, torch.float32)):
        x, r = _rand(rows, 256, dtype=dtype, gen=g), _rand(rows, 256, dtype=dtype, gen=g)
        nw, w = _rand(256, dtype=dtype, gen=g), _rand(64, 256, dtype=dtype, gen=g)
        w_gu, wd = _rand(512, 256, dtype=dtype, gen=g), _rand(64, 256, dtype=dtype, gen=g)
        (y, s), (out, s1) = _dispatch_both(x, r, nw, w, w_gu, wd, FUSED)
        (y_ref, s_ref), (out_ref, s1_ref) = _dispatch_both(x, r, nw, w, w_gu, wd, UNFUSED)
        assert torch.equal(y, y_ref) and torch.equal(s, s_ref)
        assert torch.equal(out, out_ref) and torch.equal(s1, s1_ref)
    assert fused_calls == []
    assert ops_linear.REFERENCE.fused_norm_gemv is False


@pytest.mark.gpu
@needs_cuda
def test_gpu_engine_greedy_tokens_equal_with_and_without_fusion(fused_calls):
    """The tiny MOSS-TD decoder in bf16 on the GPU: greedy tokens with the fused decode GEMVs (captured in
    the batch-1 graph, and in eager steps) are those without them, and the fused kernels did run."""
    from engine import Engine, EngineConfig, Sequence
    from tests.engine.test_async_decode import TINY

    runs = {"off": (False, 64), "on": (True, 64), "eager": (True, 0)}
    both = {"add_rms_norm_gemv", "add_rms_norm_gemv_swiglu"}
    kernels = {"off": set(), "on": both, "eager": both}
    outs = {}
    for name, (fused, graph_bs) in runs.items():
        eng = Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY, device="cuda",
                                  dtype="bfloat16", fused_decode_gemv=fused, cuda_graph_max_bs=graph_bs,
                                  kv_budget_bytes=32 << 20, max_running_requests=8, seed=7))
        assert eng.config.small_batch_gemv and eng.config.fused_decode_gemv is fused
        assert (eng.runner.graphs is not None) == (graph_bs > 0)
        gen = torch.Generator().manual_seed(0)
        seqs = [Sequence(prompt_ids=torch.randint(0, 512, (int(n),), generator=gen).tolist(), max_new_tokens=24,
                         ignore_eos=True) for n in (5, 40, 77)]
        for s in seqs:  # one at a time: batch-1 decode steps are the ones the fusion changes
            eng.generate([s])
        outs[name] = [s.output_ids for s in seqs]
        # batch-1 steps (graph capture and warm-up, or eager steps) went through the fused kernels, or never
        assert set(fused_calls) == kernels[name], (name, set(fused_calls))
        fused_calls.clear()
    assert all(len(o) == 24 for o in outs["off"])
    assert outs["on"] == outs["off"] and outs["eager"] == outs["off"]


def test_fused_dispatch_rule(monkeypatch):
    """Where the GEMV would run (``_takes_gemv``: CUDA only, so stood in for here), the fused kernel runs iff
    the choice asks for it, the row is one and the norm weight and residual fit x."""
    monkeypatch.setattr(ops_linear, "_takes_gemv", lambda x, w, choice: x.shape[0] <= choice.gemv_max_rows)
    x, w = torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    nw = torch.ones(64, dtype=torch.bfloat16)
    rule = ops_linear._takes_fused_gemv
    assert rule(x, None, nw, w, FUSED) and rule(x, x.clone(), nw, w, FUSED)
    assert not rule(x, x, nw, w, UNFUSED)  # the choice's flag
    assert not rule(torch.zeros(2, 64, dtype=torch.bfloat16), None, nw, w,
                    LinearKernels(gemv_max_rows=2, fused_norm_gemv=True))  # one row only
    assert not rule(x, None, nw.float(), w, FUSED)  # the norm weight's dtype
    assert not rule(x, torch.zeros(1, 32, dtype=torch.bfloat16), nw, w, FUSED)  # the residual's shape
    assert not rule(x, None, nw, w.t().contiguous().t(), FUSED)  # weight rows not contiguous
