"""Reference points for bench_engine: measured HBM bandwidth, the HBM limit of a decode workload, and the
naive transformers baseline (eager loop with a dynamic KV cache) on the same decoder weights."""

from __future__ import annotations

import time

import torch


def measure_copy_bandwidth(gib: float = 2.0, iters: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written (median of iters)."""
    n = int(gib * (1 << 30))
    x = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del x, y
    times.sort()
    return 2 * n / times[len(times) // 2]


def decoder_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the decoder weights one decode step reads: the language model (its embedding matrix counted
    once: as lm_head when tied; only a few rows are gathered for the input tokens) and an untied lm_head."""
    lm = model.model.language_model
    total = sum(p.numel() * p.element_size() for p in lm.parameters())
    if model.lm_head.weight.data_ptr() != lm.embed_tokens.weight.data_ptr():
        total += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    return total


def hbm_limit_s(weight_bytes: int, kv_bytes_per_token: int, bandwidth: float, rounds: int, batch: int,
                prompt_len: int, out_tokens: int) -> float:
    """Seconds to read what decode must read: ``rounds`` rounds of ``out_tokens`` steps, each step reading
    the weights once and the KV of ``batch`` sequences at context ``prompt_len + t`` (t = 0..out-1)."""
    kv_tokens = batch * (out_tokens * prompt_len + out_tokens * (out_tokens - 1) / 2)
    return rounds * (out_tokens * weight_bytes + kv_tokens * kv_bytes_per_token) / bandwidth


@torch.inference_mode()
def naive_transformers_ms_per_token(model: torch.nn.Module, context: int, steps: int = 100,
                                    warmup: int = 5, device: str = "cuda") -> dict:
    """transformers ``Qwen3ForCausalLM`` (eager, default attention, ``DynamicCache``) with our decoder's
    weights: prefill ``context`` random tokens, then greedy single-token steps; ms per decode token."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = model.config.text
    hf_cfg = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                         num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                         rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
                         max_position_embeddings=c.max_position_embeddings,
                         tie_word_embeddings=c.tie_word_embeddings)
    dtype = model.lm_head.weight.dtype
    with torch.device("meta"):
        hf = Qwen3ForCausalLM(hf_cfg)
    hf = hf.to_empty(device=device).to(dtype)
    state = {f"model.{k}": v for k, v in model.model.language_model.state_dict().items()}
    state["lm_head.weight"] = model.lm_head.weight
    hf.load_state_dict(state, strict=True)
    hf.tie_weights()
    hf.eval()
    ids = torch.randint(0, c.vocab_size, (1, context), device=device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = hf(input_ids=ids, use_cache=True)
    sync()
    prefill_s = time.perf_counter() - t0
    cache = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            t0 = time.perf_counter()
        out = hf(input_ids=nxt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        nxt.item()  # a naive loop reads each token back before the next step
    ms = (time.perf_counter() - t0) / steps * 1e3
    del hf, cache, out
    if device != "cpu":
        torch.cuda.empty_cache()
    return {"context": context, "steps": steps, "prefill_s": prefill_s, "ms_per_token": ms}
