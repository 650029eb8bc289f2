"""Decode CUDA graphs: buckets, replay equals eager, padding rows touch only the dummy slot."""

from __future__ import annotations

import pytest
import torch

from engine.cuda_graph import default_buckets
from tests.conftest import TINY_MOSS, teacher_forcing

CUDA = torch.cuda.is_available()


def test_default_buckets():
    assert default_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert default_buckets(160) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160]
    assert default_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert default_buckets(1) == [1]


def _engine(graph_bs: int, dtype: str = "float32", kv_dtype: str = "auto"):
    from engine import Engine, EngineConfig

    return Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY_MOSS, device="cuda",
                               dtype=dtype, kv_dtype=kv_dtype, attention_backend="triton", cuda_graph_max_bs=graph_bs,
                               kv_budget_bytes=256 << 20, max_running_requests=40, seed=3))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_e4m3"])
def test_graph_replay_matches_eager_and_padding_is_harmless(kv_dtype):
    """Same weights, same prompts: decode steps through graphs (batch sizes 1..37, padded to buckets) give
    the eager logits, and free KV slots return to the initial count; with the FP8 cache too (its scales
    are static buffers the captured store and attention kernels point at)."""
    from engine import Sequence

    graph, eager = _engine(48, kv_dtype=kv_dtype), _engine(0, kv_dtype=kv_dtype)
    assert graph.kv.quantized == (kv_dtype == "fp8_e4m3")
    assert graph.runner.graphs is not None and eager.runner.graphs is None
    gen = torch.Generator().manual_seed(0)
    results = {}
    for name, eng in (("graph", graph), ("eager", eager)):
        free0 = eng.allocator.num_free
        logs: dict[int, list[torch.Tensor]] = {}

        record = teacher_forcing(logs, 16)

        gen.manual_seed(0)
        seqs = []
        for i in range(37):
            n = int(torch.randint(1, 300, (1,), generator=gen))
            ids = torch.randint(0, 150_000, (n,), generator=gen).tolist()
            seqs.append(Sequence(prompt_ids=ids, max_new_tokens=5 + (i * 3) % 17, ignore_eos=True,
                                 logits_processor=record, tag=i))
        eng.generate(seqs)
        assert eng.allocator.num_free == free0
        results[name] = logs
    assert graph.runner.graphs.replays > 0
    for tag, steps in results["eager"].items():
        got = results["graph"][tag]
        assert len(got) == len(steps)
        for a, b in zip(got, steps, strict=True):
            assert torch.allclose(a, b, rtol=1e-3, atol=1e-3), float((a - b).abs().max())
