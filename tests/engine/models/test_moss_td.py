"""MOSS-TD in our engine equals an independent transformers reference (tiny random config, same weights).

The reference (tests/engine/models/moss_reference.py) is built from transformers' WhisperFeatureExtractor,
WhisperEncoder and Qwen3ForCausalLM plus an nn.Sequential adapter; its weights reach the engine through a
sharded safetensors directory with the released checkpoint's names, loaded by ``load_moss_td``.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, FinishReason, Sequence
from engine.loaders.moss_td import load_moss_td
from engine.models.moss_td_prompt import build_prompt
from tests.engine.models.moss_reference import Reference, make_audio
from transcription.moss_td.sequence import build_moss_sequence

pytest.importorskip("transformers")

N_NEW = 10  # tokens compared per single request
N_BATCH = 60  # long enough that all four batched requests are running at once
SECONDS = {30: 1, 75: 2, 150: 3, 45: 4}  # audio length -> seed of its test signal


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reference():
    return Reference(seed=0)


@pytest.fixture(scope="module")
def checkpoint(reference, tmp_path_factory):
    return reference.write_checkpoint(tmp_path_factory.mktemp("moss") / "ckpt")


def _engine(path, chunk_size: int) -> Engine:
    return Engine(EngineConfig(model="moss-td", model_path=str(path), load_format="hf", chunk_size=chunk_size,
                               kv_budget_bytes=64 << 20, max_running_requests=8))


@pytest.fixture(scope="module")
def engine(checkpoint):
    return _engine(checkpoint, 4096)


@pytest.fixture(scope="module")
def engine64(checkpoint):
    return _engine(checkpoint, 64)


@pytest.fixture(scope="module")
def expected(reference, engine):
    """Reference greedy tokens and logits per audio length (prompts from our builder: 2 s markers)."""
    cache = {}

    def get(seconds):
        if seconds not in cache:
            wave = make_audio(seconds, SECONDS[seconds])
            seq = build_moss_sequence(engine, wave, max_new_tokens=N_BATCH)
            cache[seconds] = reference.greedy(seq.prompt_ids, wave, N_BATCH)
        return cache[seconds]

    return get


def _request(engine, seconds, record: list | None = None, n: int = N_NEW) -> Sequence:
    seq = build_moss_sequence(engine, make_audio(seconds, SECONDS[seconds]), max_new_tokens=n)
    seq.stop_token_ids = ()  # compare a fixed number of steps
    seq.stop_checker = None
    if record is not None:
        seq.logits_processor = lambda s, logits: (record.append(logits.clone()), logits)[1]
    return seq


def test_loader_maps_every_checkpoint_tensor(engine, reference):
    ours = engine.model.state_dict()
    theirs = reference.state_dict()
    assert set(ours) == set(theirs) | {"lm_head.weight"}
    for name, t in theirs.items():
        assert torch.equal(ours[name], t), name
    assert engine.model.lm_head.weight is engine.model.model.language_model.embed_tokens.weight
    assert engine.loaded.info["marker_every_s"] == 2  # no processor config in this checkpoint


@pytest.mark.parametrize("seconds", [30, 75, 150])
def test_greedy_tokens_and_logits_equal_reference(engine, expected, seconds):
    logits: list[torch.Tensor] = []
    seq = _request(engine, seconds, logits)
    engine.generate([seq])
    ref_tokens, ref_logits = expected(seconds)
    assert seq.output_ids == ref_tokens[:N_NEW]
    assert len(set(ref_tokens[:N_NEW])) > 1
    for ours, theirs in zip(logits, ref_logits[:N_NEW], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-3)
    assert "embed_fn" not in seq.mm_state  # the audio embeddings are dropped after prefill


def test_chunked_prefill_64_with_four_requests_batched(engine64, expected):
    order = (30, 45, 75, 150)
    seqs = [_request(engine64, s, n=N_BATCH) for s in order]
    for s in seqs:
        engine64.submit(s)
    steps_with_all = 0
    while not all(s.finished for s in seqs):
        engine64.step()
        steps_with_all += len(engine64.scheduler.running) == 4
    assert steps_with_all > 10  # the four ran together, prefill chunks interleaved with decodes
    for seconds, seq in zip(order, seqs, strict=True):
        assert seq.finish_reason == FinishReason.LENGTH
        assert seq.output_ids == expected(seconds)[0], seconds


def test_audio_reaches_the_logits(engine, reference):
    """The parity above has power only if the audio matters: other audio, other logits."""
    first = []
    for seed in (1, 7):
        rec: list[torch.Tensor] = []
        seq = build_moss_sequence(engine, make_audio(30, seed), max_new_tokens=1)
        seq.logits_processor = lambda s, logits, rec=rec: (rec.append(logits.clone()), logits)[1]
        engine.generate([seq])
        first.append(rec[0])
    assert (first[0] - first[1]).abs().max() > 0.1


def test_five_second_markers_from_processor_config(reference, expected, tmp_path):
    path = reference.write_checkpoint(tmp_path / "ckpt5", shards=1, marker_every_s=5)
    eng = _engine(path, 4096)
    assert eng.loaded.info["marker_every_s"] == 5
    rec: list[torch.Tensor] = []
    seq = _request(eng, 30, rec)
    two_s = build_prompt(eng.tokenizer, 30 * 16_000, None, 2)
    assert len(seq.prompt_ids) == len(two_s.ids) - 26 + 11  # 5 s: 11 marker digits instead of 26
    eng.generate([seq])
    tokens, logits = reference.greedy(seq.prompt_ids, make_audio(30, SECONDS[30]), N_NEW)
    assert tokens != expected(30)[0][:N_NEW]  # the markers changed the prompt, and so the output
    assert seq.output_ids == tokens
    torch.testing.assert_close(rec[0], logits[0], rtol=1e-4, atol=1e-3)


def test_pad_count_mismatch_fails_the_request_not_the_engine(engine):
    seq = _request(engine, 30)
    seq.mm_inputs["audio"] = seq.mm_inputs["audio"][:16_000]  # 1 s of audio for a 30 s prompt
    ok = _request(engine, 30)
    engine.generate([seq])
    assert seq.finish_reason == FinishReason.ERROR and "audio_pad" in seq.error
    engine.generate([ok])
    assert ok.finish_reason == FinishReason.LENGTH


def test_full_size_shapes_and_names_on_meta():
    lm = load_moss_td(EngineConfig(model="moss-td", load_format="dummy", device="meta", dtype="bfloat16"))
    m = lm.model
    params = dict(m.named_parameters())
    assert len(params) == 683  # the released checkpoint's tensor count (lm_head tied)
    count = {p: sum(v.numel() for k, v in params.items() if k.startswith(p))
             for p in ("model.whisper_encoder.", "model.vq_adaptor.", "model.language_model.")}
    assert count == {"model.whisper_encoder.": 307_216_384, "model.vq_adaptor.": 5_246_976,
                     "model.language_model.": 596_049_920}  # 0.909 B in all
    assert params["model.whisper_encoder.conv2.weight"].shape == (1024, 1024, 3)
    assert m.model.whisper_encoder.conv2.stride == (2,)
    assert params["model.whisper_encoder.embed_positions.weight"].shape == (1500, 1024)
    assert "model.whisper_encoder.layers.0.self_attn.k_proj.bias" not in params
    assert "model.whisper_encoder.layers.23.self_attn.v_proj.bias" in params
    assert params["model.vq_adaptor.layers.0.weight"].shape == (1024, 4096)
    assert params["model.vq_adaptor.layers.3.weight"].shape == (1024,)
    assert m.model.vq_adaptor.layers[3].eps == 1e-6
    assert params["model.language_model.layers.27.self_attn.q_proj.weight"].shape == (2048, 1024)
    assert params["model.language_model.layers.0.self_attn.k_proj.weight"].shape == (1024, 1024)
    assert params["model.language_model.layers.0.self_attn.q_norm.weight"].shape == (128,)
    assert params["model.language_model.layers.0.mlp.gate_proj.weight"].shape == (3072, 1024)
    assert m.kv_layout() == (28, 8, 128) and m.max_context == 131_072
    assert m.config.text.rope_theta == 1e6
