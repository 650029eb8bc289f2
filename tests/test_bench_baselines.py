"""``benchmarks/bench_baselines.py``'s transformers baselines on a tiny Qwen3 decoder: the static-cache loop
(the compiled baseline's) gives the eager ``DynamicCache`` loop's greedy tokens on the same weights, so the
static cache is filled and read where it should be; Dynamo captures its decode step whole, once. And how
``bench_engine.py`` stores them."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from functools import partial
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_baselines as bb
import bench_engine

from engine import Engine, EngineConfig, Sequence
from engine.loaders.moss_td import load_moss_td

# Small enough for a fast CPU step; init_std 0.5 keeps the random decoder's greedy tokens varied (at 0.05 it
# repeats one token, which would make the comparison blind) and its activations clear of float32 subnormals.
TINY = {
    "text_config": {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 1024,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
    "audio_config": {"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 128},
    "init_std": 0.5,
}
CONTEXT, STEPS, WARMUP = 32, 10, 2


def tiny_decoder(device: str) -> torch.nn.Module:
    return load_moss_td(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY, device=device,
                                     dtype="float32", seed=0)).model


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY, device="cpu", seed=0))


@pytest.fixture(scope="module")
def cpu_model(engine):
    return engine.model


@pytest.fixture(scope="module")
def eager_reference(cpu_model):
    return bb.naive_transformers_ms_per_token(cpu_model, CONTEXT, STEPS, WARMUP, device="cpu")


def check_fields(res: bb.DecodeBaseline) -> None:
    assert (res.context, res.steps, res.warmup) == (CONTEXT, STEPS, WARMUP)
    assert res.ms_per_token > 0 and res.prefill_s > 0
    assert res.dtype == "torch.float32"
    assert (res.transformers, res.torch) == (transformers.__version__, torch.__version__)
    assert len(res.tokens) == 1 + WARMUP + STEPS and all(0 <= t < 1024 for t in res.tokens)
    out = res.to_json()
    assert "tokens" not in out and out["ms_per_token"] == res.ms_per_token
    json.dumps(out)


def test_eager_reference_tokens_vary_with_the_prompt(cpu_model, eager_reference):
    check_fields(eager_reference)
    assert eager_reference.compile_s is None and eager_reference.attn_implementation == "sdpa"
    assert len(set(eager_reference.tokens)) > 5  # varied: an equal sequence below means something
    other = bb.naive_transformers_ms_per_token(cpu_model, CONTEXT, 2, 1, device="cpu", seed=1)
    assert other.tokens != eager_reference.tokens[:4]


def test_the_baselines_run_the_engines_decoder(engine, eager_reference):
    # transformers' model built from the engine's weights decodes the engine's greedy tokens: the same model
    # (rotary tables included), so the baselines and the engine are timed on one computation
    seq = Sequence(prompt_ids=bb._prompt(1024, CONTEXT, 0, "cpu")[0].tolist(), max_new_tokens=1 + WARMUP + STEPS,
                   ignore_eos=True)
    seq.stop_checker = None
    engine.submit(seq)
    while not seq.finished:
        engine.step()
    assert seq.output_ids == eager_reference.tokens


def test_static_cache_compiled_decode_gives_the_eager_dynamic_cache_tokens(cpu_model, eager_reference):
    # Dynamo's whole-graph capture (fullgraph, recompiles raise) without Inductor's C++ build, which takes
    # ~30 s cold on two cores; the Inductor + CUDA-graph path is the GPU test's.
    res = bb.compiled_transformers_ms_per_token(cpu_model, CONTEXT, STEPS, WARMUP, device="cpu", backend="eager")
    check_fields(res)
    assert res.attn_implementation == "sdpa" and res.compile_s > 0
    assert "StaticCache" in res.recipe and "backend='eager'" in res.recipe
    assert res.tokens == eager_reference.tokens


def test_the_first_decode_call_is_never_timed(cpu_model):
    with pytest.raises(ValueError, match="warmup"):
        bb.compiled_transformers_ms_per_token(cpu_model, CONTEXT, STEPS, 0, device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# torch 2.11's Inductor warns from its own code on this path (H200 image, at 2e6c029 and after): the
# TorchScript deprecation at import, TF32 off for this float32 model, "The CUDA Graph is empty" for a
# kernel-free partition of the tiny model. This test checks tokens, not torch's hygiene: torch's warning
# classes are ignored here only.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_reduce_overhead_compile_on_cuda_gives_the_eager_tokens():
    model = tiny_decoder("cuda")
    ref = bb.naive_transformers_ms_per_token(model, CONTEXT, STEPS, WARMUP, device="cuda")
    res = bb.compiled_transformers_ms_per_token(model, CONTEXT, STEPS, WARMUP, device="cuda")
    torch._dynamo.reset()  # its CUDA-graph pool and compiled code stay out of later tests
    assert "mode='reduce-overhead'" in res.recipe and res.compile_s > 0 and res.ms_per_token > 0
    assert res.tokens == ref.tokens


def test_bench_engine_stores_both_baselines_with_the_w_long_extrapolation(monkeypatch, cpu_model):
    monkeypatch.setattr(bench_engine, "compiled_transformers_ms_per_token",
                        partial(bb.compiled_transformers_ms_per_token, backend="eager"))
    res: dict = {}
    args = Namespace(probe_context=CONTEXT, naive_steps=3, compiled_steps=4)
    assert bench_engine.transformers_baselines(res, args, lambda: cpu_model) == []
    assert list(res) == ["naive_transformers", "compiled_transformers"]
    for name, steps in (("naive_transformers", 3), ("compiled_transformers", 4)):
        r = res[name]
        assert (r["context"], r["steps"], "tokens" in r) == (CONTEXT, steps, False)
        assert r["extrapolated_w_long_c1_s_per_request"] == pytest.approx(r["ms_per_token"] * 10.26)
    assert res["compiled_transformers"]["compile_s"] > 0 and res["naive_transformers"]["compile_s"] is None


def test_bench_engine_records_a_failing_baseline_and_skips_zero_steps(monkeypatch, cpu_model):
    def broken(*_a, **_k):
        raise RuntimeError("no graph")

    monkeypatch.setattr(bench_engine, "compiled_transformers_ms_per_token", broken)
    res: dict = {}
    failed = bench_engine.transformers_baselines(res, Namespace(probe_context=CONTEXT, naive_steps=0,
                                                                compiled_steps=2), lambda: cpu_model)
    assert failed == ["compiled_transformers"]
    assert res == {"compiled_transformers": {"error": "RuntimeError: no graph"}}
    res = {}
    assert bench_engine.transformers_baselines(res, Namespace(probe_context=CONTEXT, naive_steps=0,
                                                              compiled_steps=0), lambda: 1 / 0) == []
    assert res == {}
