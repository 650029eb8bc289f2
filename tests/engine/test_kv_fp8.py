"""FP8 (e4m3) KV cache on the torch path: the quantisation rule, the pool, the memory plan and the engine.

The Triton side (store kernel, decode and extend over codes) is tests/engine/attention/test_fp8_kernels.py;
the quality on real and full-size models is benchmarks/eval_fp8_kv.py and the GPU tests.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine import Engine, EngineConfig, Sequence
from engine.kv import KVPool, fp8
from engine.resolve import resolve_config
from tests.engine.test_async_decode import TINY  # vocab 512: greedy ties improbable with random weights


def test_quantize_keeps_each_value_within_half_an_e4m3_step():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, 128, generator=gen) * torch.logspace(-3, 3, 64)[:, None, None]
    x[3, 2] = 0
    codes, scale = fp8.quantize(x.to(torch.bfloat16))
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (64, 8) and scale.dtype == torch.float32
    xb = x.to(torch.bfloat16).float()
    err = (fp8.dequantize(codes, scale) - xb).abs()
    # 3 mantissa bits: half a step is 2**-4 of the value; below 2**-6 (subnormal codes) 2**-10 of the scale
    assert bool((err <= torch.maximum(xb.abs() * 2**-4, scale[..., None] * 2**-10) * (1 + 1e-6)).all())
    assert bool((codes.float().abs().amax(-1)[scale != 1] == 448).all())  # each row's largest maps to 448
    assert scale[3, 2] == 1 and not codes[3, 2].float().any()


def test_pool_bytes_and_round_trip():
    assert KVPool.bytes_per_token(28, 8, 128, torch.float8_e4m3fn) == 28 * 2 * 8 * (128 + 4)
    assert KVPool.bytes_per_token(28, 8, 128, torch.bfloat16) / KVPool.bytes_per_token(
        28, 8, 128, torch.float8_e4m3fn) == pytest.approx(256 / 132)
    pool = KVPool(2, 9, 2, 16, torch.float8_e4m3fn, "cpu")
    assert pool.quantized and len(pool.k_scale) == 2 and pool.k_scale[0].shape == (10, 2)
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    slots = torch.tensor([7, 1, 4])
    pool.store(1, slots, k, v)
    rk, rv = pool.read(1, slots)
    kc, ks = fp8.quantize(k)
    assert torch.equal(rk, fp8.dequantize(kc, ks)) and rv.dtype == torch.float32
    other = torch.tensor([0, 2, 3, 5, 6, 8, 9])
    assert not pool.k[1].view(torch.uint8)[other].any() and not pool.k[0].view(torch.uint8).any()
    plain = KVPool(1, 4, 2, 16, torch.bfloat16, "cpu")
    assert not plain.quantized and plain.k_scale == [] and plain.destination(0, slots[:1]).k_scale is None


def test_memory_plan_holds_194_times_the_tokens():
    """Same byte budget, full-size MOSS-TD (meta device: no memory): FP8 slots = bf16 slots x 256/132."""
    budget = 40 << 30
    engines = [Engine(EngineConfig(model="moss-td", load_format="dummy", device="meta", dtype="bfloat16",
                                   kv_dtype=kv, kv_budget_bytes=budget, max_running_requests=16))
               for kv in ("auto", "fp8_e4m3")]
    bf16, f8 = engines
    assert bf16.kv_bytes_per_token == 114_688 and f8.kv_bytes_per_token == 59_136
    assert bf16.allocator.num_slots == budget // 114_688 and f8.allocator.num_slots == budget // 59_136
    assert f8.kv.k[0].dtype == torch.float8_e4m3fn and f8.kv.k_scale[0].dtype == torch.float32
    st = f8.stats()
    assert st["config"]["kv_dtype"] == "fp8_e4m3" and st["kv_storage_dtype"] == "float8_e4m3fn"
    assert st["kv_bytes_per_token"] == 59_136 and bf16.stats()["kv_storage_dtype"] == "bfloat16"


def test_unknown_kv_dtype_is_refused():
    with pytest.raises(ValueError, match="kv_dtype 'int4'.*auto, fp8_e4m3"):
        resolve_config(EngineConfig(kv_dtype="int4"))




def _tiny(kv_dtype: str) -> Engine:
    return Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY, kv_dtype=kv_dtype,
                               kv_budget_bytes=8 << 20, max_running_requests=8, chunk_size=32, seed=7))


@pytest.mark.usefixtures("one_torch_thread")
def test_engine_with_fp8_kv_tracks_the_float32_cache_and_frees_every_slot():
    """Teacher-forced (the same tokens fed to both), CPU reference path: the FP8 cache's logits stay close
    to the float32 cache's at every step, with the same top-1 on nearly all; KV comes back in full."""
    rng = random.Random(5)
    prompts = [[rng.randrange(512) for _ in range(rng.randrange(20, 90))] for _ in range(6)]
    forced = [[rng.randrange(512) for _ in range(24)] for _ in prompts]
    logits: dict[str, list[torch.Tensor]] = {}
    for kv in ("auto", "fp8_e4m3"):
        eng = _tiny(kv)
        store = logits.setdefault(kv, [])

        def force(seq, row, got=store):
            got.append(row.float().clone())
            out = torch.full_like(row, -1e9)
            out[forced[seq.tag][len(seq.output_ids)]] = 0
            return out

        seqs = [Sequence(prompt_ids=p, max_new_tokens=24, ignore_eos=True, logits_processor=force, tag=i)
                for i, p in enumerate(prompts)]
        eng.generate(seqs)
        assert [s.output_ids for s in seqs] == forced
        assert eng.allocator.num_free == eng.allocator.num_slots and eng.table.num_free == eng.max_reqs
    a, b = torch.stack(logits["auto"]), torch.stack(logits["fp8_e4m3"])
    rel = (b - a).norm(dim=-1) / a.norm(dim=-1)
    # e4m3 rounds each K/V value by up to 2**-4 of itself; through this tiny random model (weights of std 0.5
    # amplify every error) that is 4.6% of a logit vector on average, 9.7% at worst (measured here). A cache
    # read without its scales, or codes off by a step, is many times that.
    assert float(rel.max()) < 0.15 and float(rel.mean()) < 0.07, (float(rel.max()), float(rel.mean()))
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9
    assert float(rel.min()) > 0  # the FP8 path is really taken
