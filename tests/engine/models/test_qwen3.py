"""Our Qwen3 decoder equals transformers' Qwen3ForCausalLM (tiny random config, same weights)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, FinishReason, Sequence
from engine.loaders import LoadedModel
from engine.loaders.moss_td import ASSET_TOKENIZER
from engine.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, apply_rotary, rotary_cos_sin
from engine.tokenizer import TextTokenizer

transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 151_936, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "tie_word_embeddings": True}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **TINY, rope_parameters={"rope_type": "default", "rope_theta": 1e6})).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def ours(hf):
    model = Qwen3ForCausalLM(Qwen3Config.from_dict({**TINY, "rope_parameters": {"rope_theta": 1e6}})).eval()
    model.load_state_dict(hf.state_dict(), strict=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def _engine(model, chunk_size: int) -> Engine:
    loaded = LoadedModel(model=model, tokenizer=TextTokenizer(ASSET_TOKENIZER), info={"name": "qwen3-tiny"})
    return Engine(EngineConfig(model="qwen3", chunk_size=chunk_size, kv_budget_bytes=32 << 20,
                               max_running_requests=8), loaded=loaded)


@torch.inference_mode()
def _hf_greedy(hf, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                      pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.stack(out.logits)[:, 0].float()


def test_config_from_dict_variants():
    assert Qwen3Config.from_dict({"rope_theta": 5e5}).rope_theta == 5e5
    rope = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert Qwen3Config.from_dict(rope).rope_theta == 1e6
    heads = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": None}
    assert Qwen3Config.from_dict(heads).head_dim == 16
    with pytest.raises(ValueError, match="yarn"):
        Qwen3Config.from_dict({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_rotary_matches_transformers_at_long_positions():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

    cfg = transformers.Qwen3Config(**{**TINY, "max_position_embeddings": 131_072},
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    pos = torch.tensor([0, 1, 4095, 78_000, 131_071])
    x = torch.randn(1, 4, len(pos), 32)  # [B, H, T, D] as transformers lays it out
    cos, sin = Qwen3RotaryEmbedding(cfg)(x, pos[None])
    ref, _ = apply_rotary_pos_emb(x, x, cos, sin)
    c, s = rotary_cos_sin(pos, 32, 1e6)
    got = apply_rotary(x[0].transpose(0, 1), c, s).transpose(0, 1)[None]  # ours is [T, H, D]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_prefill_logits_equal_transformers(hf, ours):
    engine = _engine(ours, 4096)
    prompt = torch.randint(0, 151_000, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    rec: list[torch.Tensor] = []
    seq = Sequence(prompt_ids=prompt, max_new_tokens=1,
                   logits_processor=lambda s, logits: (rec.append(logits.clone()), logits)[1])
    engine.generate([seq])
    with torch.inference_mode():
        ref = hf(torch.tensor([prompt]), logits_to_keep=1).logits[0, -1].float()
    torch.testing.assert_close(rec[0], ref, rtol=1e-4, atol=1e-3)


def test_greedy_tokens_chunked_and_batched_equal_transformers(hf, ours):
    engine = _engine(ours, 64)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 151_000, (n,), generator=g).tolist() for n in (7, 150, 400)]
    recs: list[list[torch.Tensor]] = [[] for _ in prompts]
    seqs = [Sequence(prompt_ids=p, max_new_tokens=40,
                     logits_processor=lambda s, logits, r=r: (r.append(logits.clone()), logits)[1])
            for p, r in zip(prompts, recs, strict=True)]
    engine.generate(seqs)
    for p, seq, rec in zip(prompts, seqs, recs, strict=True):
        tokens, logits = _hf_greedy(hf, p, 40)
        assert seq.finish_reason == FinishReason.LENGTH
        assert seq.output_ids == tokens
        assert len(set(tokens)) > 2
        torch.testing.assert_close(torch.stack(rec), logits, rtol=1e-4, atol=1e-3)


def test_fused_projections_keep_names_storage_and_tokens(hf):
    fused = Qwen3ForCausalLM(Qwen3Config.from_dict({**TINY, "rope_parameters": {"rope_theta": 1e6}})).eval()
    fused.load_state_dict(hf.state_dict(), strict=True)
    fused.fuse_projections()
    attn, mlp = fused.model.layers[1].self_attn, fused.model.layers[1].mlp
    assert attn.qkv_weight.shape == (4 * 32 + 2 * 2 * 32, 64) and mlp.gate_up_weight.shape == (256, 64)
    # HF names still address the weights, as views of the one fused matrix
    assert attn.k_proj.weight.data_ptr() == attn.qkv_weight[4 * 32].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up_weight[128].data_ptr()
    ref_sd = hf.state_dict()
    for name, t in fused.state_dict().items():
        assert torch.equal(t, ref_sd[name]), name
    prompt = torch.randint(0, 151_000, (90,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = Sequence(prompt_ids=prompt, max_new_tokens=30)
    _engine(fused, 32).generate([seq])
    assert seq.output_ids == _hf_greedy(hf, prompt, 30)[0]
    # Module.to converts each parameter on its own; the fused matrices are rebuilt from them
    fused.double()
    assert attn.qkv_weight.dtype == torch.float64
    assert attn.v_proj.weight.data_ptr() == attn.qkv_weight[6 * 32].data_ptr()
    torch.testing.assert_close(attn.qkv_weight[:128].float(), ref_sd["model.layers.1.self_attn.q_proj.weight"])
