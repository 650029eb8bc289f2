"""Prefill CUDA graphs: a mixed step split into a decode graph and a prefill graph gives the eager logits.

On the CPU: :meth:`ForwardBatch.split` (what the two graphs each receive) computes the same logits as the
whole batch, at every legal split of random steps; and every path of ``ModelRunner._replay`` (the Triton
backend under the interpreter, graph capture and replay emulated) gives the eager logits. On the GPU: an engine with prefill graphs against one without, audio requests arriving while
others decode, logits compared at every step under teacher forcing.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from engine import Engine, EngineConfig, Sequence
from engine.loaders.moss_td import TINY_DUMMY_CONFIG
from engine.sampling import sample_step
from tests.conftest import TINY_MOSS, noise, teacher_forcing
from transcription.moss_td.sequence import build_moss_sequence

CUDA = torch.cuda.is_available()
if not CUDA:  # the graph-path test runs the Triton backend under the interpreter: set before kernels load
    os.environ.setdefault("TRITON_INTERPRET", "1")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
    audio = build_moss_sequence(eng, noise(6.0, 0), max_new_tokens=4)
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

        record = teacher_forcing(logs, 7)

        seqs = []
        for i in range(14):  # audio of 1-40 s (13-500 audio tokens) and text prompts, arriving in waves
            if i % 3 == 2:
                s = Sequence(prompt_ids=list(range(1000 + i, 1000 + i + 17 * i)), max_new_tokens=6)
            else:
                s = build_moss_sequence(eng, noise(1.0 + 3.0 * i, i), max_new_tokens=4 + i % 5)
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


def test_split_at_every_legal_k_gives_the_whole_batch_logits():
    """Random steps (decodes, prompt continuations, first chunks, audio chunks, one-token prompt chunks at
    chunk sizes 1-40): ``num_decode_prefix`` counts exactly the leading decodes (never a prompt chunk, even
    of one token), and for every legal ``k`` the two halves of ``split(k)`` give the whole step's logits."""
    eng = Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY_DUMMY_CONFIG,
                              device="cpu", max_context=512, kv_budget_bytes=8 << 20, max_running_requests=8,
                              chunk_size=16, async_decode=False, encoder_cache_entries=0, seed=2))
    rng = random.Random(5)
    seen = {"audio tail": 0, "1-token chunk after the decodes": 0, "all decodes": 0, "splits": 0}
    live: list[Sequence] = []
    for i in range(200):  # arrivals for 50 steps, then the rest drains (steps of decodes only)
        if i >= 50 and not live:
            break
        if i < 50 and len(live) < 8 and rng.random() < 0.5:
            if rng.random() < 0.4:
                s = build_moss_sequence(eng, noise(rng.choice([1.0, 2.0]), i),
                                        max_new_tokens=rng.randint(2, 20))
            else:
                s = Sequence(prompt_ids=[rng.randrange(1, 150_000) for _ in range(rng.choice([1, 2, 9, 30]))],
                             max_new_tokens=rng.randint(1, 20), ignore_eos=True)
            eng.submit(s)
            live.append(s)
        eng.scheduler.chunk_size = rng.choice([1, 2, 5, 16, 40])
        eng._drain()
        step = eng.scheduler.schedule()
        if step is None:
            continue
        eng.model.prepare(step.admitted, eng.cross)
        fb, sample = eng.runner.build(step)
        k = 0
        while k < len(step.items) and step.items[k][1] == 1 and step.items[k][0].prefill_done:
            k += 1
        assert fb.num_decode_prefix == k
        b = fb.batch_size
        if k < b and step.items[k][1] == 1:  # a prompt chunk of one token right after the decodes
            seen["1-token chunk after the decodes"] += 1
        seen["all decodes"] += k == b
        whole = eng.runner.forward(fb)
        for j in range(1, min(k, b - 1) + 1):
            head, tail = fb.split(j)
            assert head.num_tokens == j and tail.num_tokens == fb.num_tokens - j
            if tail.input_embeds is not None:
                assert tail.input_embeds.shape[0] == tail.num_tokens
                seen["audio tail"] += bool(tail.embeds_mask.any())
            parts = torch.cat([eng.runner.forward(head), eng.runner.forward(tail)])
            torch.testing.assert_close(parts, whole, rtol=1e-4, atol=1e-4)
            seen["splits"] += 1
        for bad in (0, k + 1, b):
            if bad == 0 or bad > k or bad == b:
                with pytest.raises(ValueError):
                    fb.split(bad)
        eng.scheduler.commit(step, sample_step(step.items, whole, sample).tokens)
        live = [s for s in live if not s.finished]
    assert min(seen.values()) > 0 and seen["splits"] >= 40, seen


# -- the graph paths on the CPU: Triton backend under the interpreter, graphs emulated -----------------
def _emulate_graphs(monkeypatch, eng: Engine, max_bs: int, buckets: tuple[int, ...], max_items: int) -> None:
    """Capture decode and prefill "graphs" for ``eng`` on the CPU. A stand-in for ``torch.cuda.CUDAGraph``
    records what the backend pointed at during capture (``attn.meta``: the static buffers, and the host
    values frozen into a graph such as the item count and the largest extend); ``replay`` runs the model
    again on the graph's static batch with that metadata and writes the static outputs, as a replay
    does. Not emulated: memory pools (the prefill graphs' own pool is checked on the GPU only)."""
    attn, model = eng.attn, eng.model

    class ReplayedForward:
        def pool(self) -> None:
            return None

        def replay(self) -> None:
            attn.meta = self.meta
            logits = model(self.batch, attn)
            self.logits.copy_(logits)
            self.greedy.copy_(logits.argmax(dim=-1))

    def graph(g, pool=None, stream=None):
        class Capture:
            def __enter__(self):
                return g

            def __exit__(self, *exc):
                g.meta = attn.meta

        return Capture()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", ReplayedForward)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: None)
    attn.max_splits = 4  # fewer interpreted programs; any power of two is valid
    eng.runner.capture_cuda_graphs(max_bs)
    eng.runner.capture_prefill_graphs(model.lm_head.weight.shape[1], eng.dtype, buckets, max_items)
    for graphs in (eng.runner.graphs, eng.runner.prefill_graphs):
        for size, (g, logits, greedy) in graphs.graphs.items():
            attn.meta = g.meta
            g.batch, g.logits, g.greedy = graphs._static_batch(size), logits, greedy


@pytest.mark.skipif(CUDA, reason="the CPU emulation; on CUDA the real graphs are compared above")
def test_graph_paths_equal_eager_on_the_cpu(monkeypatch):
    """Async decode (the CUDA default) over every path of ``ModelRunner._replay``, each step checked against
    the eager logits and greedy ids: the decode graph alone (with padded rows, and once with a one-token
    prompt chunk), the prefill graph alone, the decode graph + a prefill graph (padded tokens and items,
    buckets filled exactly, audio embeddings), and the eager fallbacks (more decodes than the largest
    decode graph, a tail above the largest bucket, more items than ``max_items``)."""
    from triton.runtime import interpreter

    from engine.attention.triton_ops import decode as decode_mod

    if not isinstance(decode_mod._decode_stage1, interpreter.InterpretedFunction):
        pytest.skip("the Triton kernels were imported before TRITON_INTERPRET was set")
    patch = interpreter._patch_lang_tensor  # Triton <= 3.5 + numpy >= 2.3: see test_triton_kernels.py

    def patch_index(tensor):
        patch(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch_index)
    text_config = {**TINY_DUMMY_CONFIG["text_config"], "num_hidden_layers": 1}  # half the interpreted work
    one_layer = {**TINY_DUMMY_CONFIG, "text_config": text_config}
    engines = [Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=one_layer, device="cpu",
                                   attention_backend=backend, max_context=256, kv_budget_bytes=2 << 20,
                                   max_running_requests=8, async_decode=True, encoder_cache_entries=0,
                                   seed=4)) for backend in ("triton", "torch")]
    eng = engines[0]
    _emulate_graphs(monkeypatch, eng, max_bs=4, buckets=(8, 32), max_items=2)  # decode buckets 1, 2, 4
    runner, g, pg = eng.runner, eng.runner.graphs, eng.runner.prefill_graphs
    real, seen, failures = runner._replay, {}, []

    def checked(fb, logits=True):
        before = (g.replays, pg.replays)
        out = real(fb, logits)
        k = fb.num_decode_prefix
        kind = {(1, 0): "decode graph", (0, 1): "prefill graph", (1, 1): "decode + prefill graphs"}.get(
            (g.replays - before[0], pg.replays - before[1]), "eager")
        if kind == "decode graph" and g.bucket(fb.batch_size) > fb.batch_size:
            kind += " (padded)"
        if kind == "eager":
            kind += (" (decodes)" if k > g.max_bs else " (tokens)" if fb.num_tokens - k > pg.max_tokens
                     else " (items)" if fb.batch_size - k > pg.max_items else "")
        if "prefill" in kind and fb.embeds_mask is not None and bool(fb.embeds_mask.any()):
            kind += " (audio)"
        seen[kind] = seen.get(kind, 0) + 1
        eng.attn.prepare(fb)
        ref = eng.model(fb, eng.attn)
        if out is None:
            return ref, ref.argmax(dim=-1)
        try:  # the engine turns a failed step into finished sequences: keep the failure for the test
            if logits or kind.startswith(("decode graph", "prefill graph")):
                torch.testing.assert_close(out[0], ref, rtol=1e-4, atol=1e-4)
            else:  # forward_greedy: a split step does not join the two graphs' logits
                assert out[0] is None, "a split step joined logits nobody reads"
                seen["split step, greedy ids only"] = seen.get("split step, greedy ids only", 0) + 1
            assert torch.equal(out[1], ref.argmax(dim=-1)), "greedy ids"
        except AssertionError as e:
            failures.append(f"{kind}: {e}")
            raise
        return out

    monkeypatch.setattr(runner, "_replay", checked)
    outputs, shapes = [], [(20, 15), (5, 14), (1, 2), (3, 2), (2, 2), (1, 1)]  # (prompt, output) tokens
    for e in engines:  # the engine with the emulated graphs, then the same steps on the reference backend
        text = [Sequence(prompt_ids=list(range(500 + 40 * i, 500 + 40 * i + n)), max_new_tokens=m,
                         ignore_eos=True) for i, (n, m) in enumerate(shapes)]
        audio = build_moss_sequence(e, noise(1.0, 9), max_new_tokens=2)
        audio.stop_checker = None
        plan = [  # (submitted before the step, chunk size); audio prompt: 99 tokens, audio at 15-27
            (text[:2], 32), ([], 32), ([audio], 8), ([], 32), ([], 40), ([], 32), ([], 8), ([], 8), ([], 8),
            (text[2:5], 8), ([], 8), ([], 8), ([text[5]], 8)]
        for new, chunk in plan:
            for s in new:
                e.submit(s)
            e.scheduler.chunk_size = chunk
            e.step()
        e.run_until_done(text + [audio])
        outputs.append([(s.output_ids, s.finish_reason) for s in text + [audio]])
        assert e.allocator.num_free == e.allocator.num_slots
    assert not failures, failures[0]
    assert set(seen) >= {"decode graph", "decode graph (padded)", "prefill graph", "decode + prefill graphs",
                         "decode + prefill graphs (audio)", "eager (decodes)", "eager (tokens)",
                         "eager (items)", "split step, greedy ids only"}, seen
    # each step matched its own eager forward; a graph writing K/V where it must not (a live slot for a
    # padded token) would also corrupt that forward's cache, but shows in the later tokens here
    assert outputs[0] == outputs[1]
