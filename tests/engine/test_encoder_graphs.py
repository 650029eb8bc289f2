"""Encoder CUDA graphs (GPU): every exact window count matches the eager encoder at Whisper-medium size,
and the engine with the encoder on its own stream (graphs, microbatches, async decode) gives the same
tokens as encoding at admission."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, FinishReason
from engine.encoder_graphs import EncoderGraphs
from engine.models.moss_td import MossTDConfig, MossTDForConditionalGeneration
from engine.models.qwen3 import Qwen3Config
from tests.conftest import noise
from transcription.moss_td.sequence import build_moss_sequence

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TINY = {  # tiny decoder and encoder (the real vocabulary: prompts hold <|audio_pad|> = 151671)
    "text_config": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
    "audio_config": {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4,
                     "encoder_ffn_dim": 128},
    "init_std": 0.5,
}


@torch.inference_mode()
def test_graphs_match_eager_at_whisper_medium_size():
    torch.manual_seed(0)
    cfg = MossTDConfig(text=Qwen3Config(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    # torch's default init keeps the encoder output O(1) (final LayerNorm at weight 1), so the tolerance
    # below is tight relative to the values
    model = MossTDForConditionalGeneration(cfg).to("cuda", torch.bfloat16).eval()
    graphs = EncoderGraphs(model.window_mel, model.audio_encoder, torch.device("cuda"), list(range(1, 9)),
                           min_free_bytes=1 << 30)
    graphs.capture(torch.cuda.Stream())
    assert sorted(graphs.graphs) == list(range(1, 9)) and not graphs.skipped
    waves = torch.randn(8, 480_000, device="cuda") * 0.1
    waves[2, 200_000:] = 0  # a zero-padded last window
    diffs = {}
    for k in (8, 3, 1, 5, 2, 7, 4, 6):  # any order: each graph has its own static input slice
        x = waves[8 - k :].contiguous()
        eager = model.audio_encoder(model.window_mel(x))
        got = graphs(x).clone()
        assert got.shape == (k, 1500, 1024) and got.dtype == torch.bfloat16
        diffs[k] = (got.float() - eager.float()).abs().max().item()
        torch.testing.assert_close(got, eager, rtol=2e-2, atol=2e-2)
    print("max |graph - eager| by window count:", diffs, "mel in graph:", graphs.mel_in_graph)


def _engine(**kw) -> Engine:
    return Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY, device="cuda",
                               max_context=8192, kv_budget_bytes=64 << 20, max_running_requests=8, seed=3,
                               **kw))


def _run(eng: Engine) -> list[list[int]]:
    """Three requests at once, then two more while those decode (one repeating an earlier recording)."""
    waves = [noise(s, i) for i, s in enumerate((8, 95, 31, 12))]
    first = [build_moss_sequence(eng, w, max_new_tokens=30) for w in waves[:3]]
    later = [build_moss_sequence(eng, w, max_new_tokens=12) for w in (waves[3], waves[1])]
    for s in first + later:
        s.stop_checker, s.stop_token_ids = None, ()
    for s in first:
        eng.submit(s)
    for _ in range(6):
        eng.step()
    for s in later:
        eng.submit(s)
    eng.run_until_done(first + later)
    assert all(s.finish_reason == FinishReason.LENGTH for s in first + later)
    assert eng.allocator.num_free == eng.allocator.num_slots
    return [s.output_ids for s in first + later]


@pytest.fixture
def _no_tf32_convs():
    # cuDNN may pick another conv algorithm per window count; with TF32 that shifts encoder outputs by
    # ~1e-3 and could flip a greedy token of this random model, which would test cuDNN, not the engine.
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


def test_stream_graphs_and_budget_give_the_tokens_of_encoding_at_admission(_no_tf32_convs):
    ref = _run(_engine(encoder_window_budget=0))
    for kw in ({}, {"encoder_window_budget": 2}, {"encoder_stream": False, "encoder_graph_buckets": ()},
               {"attention_backend": "triton", "async_decode": True}):
        eng = _engine(**kw)
        assert eng.encoder.enabled and (eng.encoder.stream is None) == (kw.get("encoder_stream") is False)
        assert _run(eng) == ref, kw
        st = eng.stats()
        assert st["encoder_cache_hits"] + st["encoder_dedup_hits"] == 1  # the repeated 95 s recording
        assert st["encoder_windows"] == 1 + 4 + 2 + 1
        if kw.get("encoder_graph_buckets", True):
            assert st["encoder_graph_replays"] == st["encoder_microbatches"] > 0


def test_cache_buffer_is_pinned_on_the_submitting_thread(monkeypatch):
    # Pinning host memory is slow (~0.8 ms per MB on an H200); on the engine loop it held up hand-overs and
    # running decodes, so the buffer the embeddings are cached in is made in submit and filled in place.
    eng = _engine()
    wave = noise(40, 7)
    seq = build_moss_sequence(eng, wave, max_new_tokens=4)
    seq.stop_checker, seq.stop_token_ids = None, ()
    eng.submit(seq)
    buf = seq.mm_state["audio_host"]
    assert buf.is_pinned() and buf.shape == (500, 64) and buf.dtype == eng.dtype  # 2 windows of TINY
    pinned_on_loop = []
    real_empty = torch.empty

    def spy(*args, **kw):
        if kw.get("pin_memory"):
            pinned_on_loop.append(args)
        return real_empty(*args, **kw)

    monkeypatch.setattr(torch, "empty", spy)
    eng.run_until_done([seq])
    assert pinned_on_loop == [] and "audio_host" not in seq.mm_state
    (entry,) = eng.encoder.cache._items.values()
    assert entry.data_ptr() == buf.data_ptr() and buf.abs().sum() > 0
    again = build_moss_sequence(eng, wave.copy(), max_new_tokens=4)  # cached: nothing to pin for it
    again.stop_checker, again.stop_token_ids = None, ()
    eng.submit(again)
    assert "audio_host" not in again.mm_state
    eng.run_until_done([again])
    assert again.output_ids == seq.output_ids and eng.stats()["encoder_cache_hits"] == 1
    assert eng.allocator.num_free == eng.allocator.num_slots
