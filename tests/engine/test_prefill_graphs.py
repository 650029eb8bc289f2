"""Prefill CUDA graphs: a mixed step split into a decode graph and a prefill graph gives the eager logits.

On the CPU: :meth:`ForwardBatch.split` (what the two graphs each receive) computes the same logits as the
whole batch. On the GPU: an engine with prefill graphs against one without, audio requests arriving while
others decode, logits compared at every step under teacher forcing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, Sequence
from engine.moss_td_pipeline import build_moss_sequence

CUDA = torch.cuda.is_available()

TINY_MOSS = {  # Qwen3 attention shape (16 q / 8 kv heads x 128), two layers, small encoder
    "text_config": {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512},
    "audio_config": {"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 128},
    "init_std": 0.05,
}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _wave(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 16_000))).astype(np.float32)


def test_split_batch_gives_the_whole_batch_logits():
    """Two decodes, then an audio prompt's first chunk: the halves of ``split`` run separately give the
    logits of the whole step (token views, rebased offsets and logits indices, embeddings of the tail)."""
    eng = Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY_MOSS, device="cpu",
                              kv_budget_bytes=64 << 20, max_running_requests=4, chunk_size=300, seed=1))
    decoding = [Sequence(prompt_ids=list(range(100 + 7 * i, 140 + 7 * i)), max_new_tokens=8, ignore_eos=True)
                for i in range(2)]
    for s in decoding:
        eng.submit(s)
    while not all(len(s.output_ids) >= 2 for s in decoding):
        eng.step()
    audio = build_moss_sequence(eng, _wave(6.0, 0), max_new_tokens=4)
    eng.submit(audio)
    eng._drain()
    while eng.encoder.has_work():
        eng._drain()
    step = eng.scheduler.schedule()
    assert step is not None and step.admitted == [audio]
    assert [n for _, n in step.items][:2] == [1, 1] and step.items[2][1] > 1
    eng.model.prepare(step.admitted, eng.cross)
    fb, _ = eng.runner.build(step)
    assert fb.num_decode_prefix == 2 and fb.input_embeds is not None
    whole = eng.runner.forward(fb)
    head, tail = fb.split(2)
    assert tail.qo_indptr[0] == 0 and tail.input_embeds.shape[0] == tail.num_tokens
    parts = torch.cat([eng.runner.forward(head), eng.runner.forward(tail)])
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        fb.split(3)  # item 2 is a prompt chunk, not a decode
    for s in decoding + [audio]:
        eng.abort(s)
    eng.step()


def _gpu_engine(prefill_graphs: bool) -> Engine:
    return Engine(EngineConfig(
        model="moss-td", load_format="dummy", dummy_config=TINY_MOSS, device="cuda", dtype="float32",
        attention_backend="triton", kv_budget_bytes=256 << 20, max_running_requests=24, chunk_size=512,
        prefill_graph_tokens=(64, 256, 512) if prefill_graphs else (), prefill_graph_max_items=8,
        async_decode=False, seed=3))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_prefill_graphs_match_eager_with_audio_arriving_during_decode():
    results, engines = {}, {}
    for name in ("graph", "eager"):
        eng = engines[name] = _gpu_engine(name == "graph")
        free0 = eng.allocator.num_free
        logs: dict[int, list[torch.Tensor]] = {}

        def record(seq, logits, logs=logs):
            logs.setdefault(seq.tag, []).append(logits[::7].clone())
            forced = torch.full_like(logits, -1e9)
            forced[(seq.tag * 7919 + len(seq.output_ids) * 104729) % logits.numel()] = 0.0  # teacher forcing
            return forced

        seqs = []
        for i in range(14):  # audio of 1-40 s (13-500 audio tokens) and text prompts, arriving in waves
            if i % 3 == 2:
                s = Sequence(prompt_ids=list(range(1000 + i, 1000 + i + 17 * i)), max_new_tokens=6)
            else:
                s = build_moss_sequence(eng, _wave(1.0 + 3.0 * i, i), max_new_tokens=4 + i % 5)
            s.ignore_eos, s.stop_checker, s.logits_processor, s.tag = True, None, record, i
            seqs.append(s)
        for wave in (seqs[:3], seqs[3:9], seqs[9:]):
            for s in wave:
                eng.submit(s)
            for _ in range(3):
                eng.step()
        eng.run_until_done(seqs)
        assert all(s.finish_reason.value == "length" for s in seqs)
        assert eng.allocator.num_free == free0
        results[name] = logs
    assert engines["graph"].runner.prefill_graphs.replays > 0
    assert engines["eager"].runner.prefill_graphs is None
    for tag, steps in results["eager"].items():
        got = results["graph"][tag]
        assert len(got) == len(steps)
        for a, b in zip(got, steps, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
