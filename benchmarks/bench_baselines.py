"""Reference points for bench_engine: measured HBM bandwidth, the HBM limit of a decode workload, and two
transformers baselines on the same decoder weights: the naive eager loop with a dynamic KV cache, and the
static cache + ``torch.compile`` recipe of transformers' own inference-optimization guide."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

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


def _sync(device: str) -> Callable[[], None]:
    """``torch.cuda.synchronize`` on a CUDA device (so host timers see the finished GPU work), else a no-op."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


@dataclass
class DecodeBaseline:
    """One transformers single-stream greedy decode run on our decoder's weights.

    ``ms_per_token`` is host wall time over the ``steps`` timed decode steps divided by ``steps``, with the
    device synchronised before and after (prefill, warm-up and compilation are not in it). ``tokens`` are the
    greedy ids (the prefill's, then one per decode step, warm-up included), kept for comparisons and left out
    of :meth:`to_json`."""

    recipe: str  # what was run, in words
    context: int  # prompt tokens prefilled before the first decode step
    steps: int  # timed decode steps
    warmup: int  # untimed decode steps before them
    prefill_s: float  # wall seconds of the (untimed) prefill
    ms_per_token: float
    attn_implementation: str  # transformers' attention backend as resolved on the model
    dtype: str
    transformers: str  # library versions of the run
    torch: str
    compile_s: float | None = None  # wall seconds of the first (compiling) decode call; None when not compiled
    tokens: list[int] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        """The result for a benchmark's JSON: every field but ``tokens``."""
        out = asdict(self)
        del out["tokens"]
        return out


def _cache_kwarg(hf: torch.nn.Module) -> str:
    """The name of the forward's KV-cache argument: ``past_key_values`` up to transformers 5.17 (the GPU
    machine's), ``cache`` later (5.24 still takes the old name but warns, FutureWarning)."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


def hf_qwen3_from_decoder(model: torch.nn.Module, device: str, attn_implementation: str | None = None):
    """transformers' ``Qwen3ForCausalLM`` holding our MOSS-TD decoder's weights (``model.model.language_model``
    and ``model.lm_head``, their dtype), built from the config on ``meta`` (nothing downloaded, no random
    init), in eval mode. ``attn_implementation=None`` is transformers' default choice.

    Raises RuntimeError (``load_state_dict(strict=True)``) when the weight names or shapes do not match."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = model.config.text
    hf_cfg = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                         num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                         rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
                         max_position_embeddings=c.max_position_embeddings,
                         tie_word_embeddings=c.tie_word_embeddings, attn_implementation=attn_implementation)
    with torch.device("meta"):
        hf = Qwen3ForCausalLM(hf_cfg)
    hf = hf.to_empty(device=device).to(model.lm_head.weight.dtype)
    # The rotary inverse frequencies are a non-persistent buffer: to_empty left them uninitialised and no
    # state dict carries them. Rebuilt after the cast, they stay float32, as from_pretrained keeps them.
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf.config).to(device)
    state = {f"model.{k}": v for k, v in model.model.language_model.state_dict().items()}
    state["lm_head.weight"] = model.lm_head.weight
    hf.load_state_dict(state, strict=True)
    hf.tie_weights()
    return hf.eval()


def _prompt(vocab_size: int, context: int, seed: int, device: str) -> torch.Tensor:
    """``context`` random token ids, shape (1, context), the same for a seed on any device."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, context), generator=g).to(device)


@torch.inference_mode()
def naive_transformers_ms_per_token(model: torch.nn.Module, context: int, steps: int = 100,
                                    warmup: int = 5, device: str = "cuda", seed: int = 0) -> DecodeBaseline:
    """transformers ``Qwen3ForCausalLM`` (:func:`hf_qwen3_from_decoder`: eager, default attention,
    ``DynamicCache``) with our decoder's weights: prefill ``context`` random tokens (all logits, untimed),
    then greedy single-token steps, each token read back to the host before the next step (what a naive
    loop does); ms per decode token over the ``steps`` after ``warmup`` (see :class:`DecodeBaseline`)."""
    import transformers
    from transformers import DynamicCache

    hf = hf_qwen3_from_decoder(model, device)
    kw = _cache_kwarg(hf)
    cache = DynamicCache(config=hf.config)
    ids = _prompt(hf.config.vocab_size, context, seed, device)
    sync = _sync(device)
    sync()
    t0 = time.perf_counter()
    out = hf(input_ids=ids, use_cache=True, **{kw: cache})
    sync()
    prefill_s = time.perf_counter() - t0
    nxt = out.logits[:, -1:].argmax(-1)
    tokens = [int(nxt.item())]
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            t0 = time.perf_counter()
        out = hf(input_ids=nxt, use_cache=True, **{kw: cache})
        nxt = out.logits[:, -1:].argmax(-1)
        tokens.append(int(nxt.item()))  # a naive loop reads each token back before the next step
    ms = (time.perf_counter() - t0) / steps * 1e3
    res = DecodeBaseline(recipe="eager forward, DynamicCache, token read back each step", context=context,
                         steps=steps, warmup=warmup, prefill_s=prefill_s, ms_per_token=ms,
                         attn_implementation=str(hf.config._attn_implementation), dtype=str(hf.dtype),
                         transformers=transformers.__version__, torch=torch.__version__, tokens=tokens)
    del hf, cache, out
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return res


def _greedy_step(forward: Callable, tok: torch.Tensor, **cache: object) -> torch.Tensor:
    """One decode step of ``forward`` (a causal LM's, compiled or not) on the (1, 1) token ``tok`` with the
    KV cache keyword ``cache``; the greedy next token, (1, 1), on the device."""
    torch.compiler.cudagraph_mark_step_begin()  # each call is a new iteration for the CUDA-graph trees
    logits = forward(input_ids=tok, use_cache=True, **cache).logits
    return logits[:, -1:].argmax(-1)  # taken before the next replay overwrites the graph's output


@torch.inference_mode()
def compiled_transformers_ms_per_token(model: torch.nn.Module, context: int, steps: int = 100, warmup: int = 5,
                                       device: str = "cuda", seed: int = 0,
                                       backend: str | None = "inductor") -> DecodeBaseline:
    """What a careful user would try for fast single-stream decode with plain transformers: the recipe of
    transformers' "LLM inference optimization" guide (static KV cache + ``torch.compile``).

    The model is :func:`hf_qwen3_from_decoder` with ``attn_implementation="sdpa"`` (the weights' dtype: bf16
    in bench_engine). A ``StaticCache(config=..., max_cache_len=context + warmup + steps)`` (the transformers
    5.x constructor) holds the KV. The prompt of ``context`` random tokens is prefilled **eagerly**, untimed
    (the guide compiles only the decode forward: prefill's shape is used once). The decode forward is
    ``torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`` (Inductor kernels replayed as
    CUDA graphs on a GPU; on a CPU there are no CUDA graphs and ``reduce-overhead`` is plain Inductor). Each
    step feeds the previous step's greedy token, which stays on the device (no read back). The cache keeps
    its write position in a device tensor at a static address (``StaticLayer.cumulative_length``), from which
    the model derives positions and the mask, so every step has the same shapes and guards: the steps after
    the first run with ``torch._dynamo`` ``error_on_recompile``, a recompilation raises instead of being timed.

    The first decode call compiles: its wall time is ``compile_s``. The next ``warmup - 1`` calls (CUDA-graph
    recording) are untimed; ``ms_per_token`` is the wall time of the next ``steps`` calls / ``steps`` with the
    device synchronised around them (see :class:`DecodeBaseline`). A manual loop rather than
    ``generate(..., cache_implementation="static")``: it times the decode steps alone (no prefill to subtract
    as a difference of two lengths) and exposes the compile time.

    ``backend`` other than ``"inductor"`` (e.g. ``"eager"``) compiles with that ``torch.compile`` backend,
    ``fullgraph=True``, no mode: Dynamo's whole-graph capture, guards and recompile check without Inductor's
    code generation (the CPU test's choice: Inductor's C++ build of even a tiny model takes ~30 s cold on two
    cores); ``None`` runs the same loop on the eager forward. The compiled code stays in
    ``torch._dynamo``'s caches (and its CUDA graphs' memory pool) until ``torch._dynamo.reset()``: the caller
    resets when later measurements must not share the process with it.

    Raises ValueError when ``warmup < 1`` (the first call is the compile and is never timed)."""
    import transformers
    from transformers import StaticCache

    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 (the first decode call compiles), got {warmup}")
    hf = hf_qwen3_from_decoder(model, device, attn_implementation="sdpa")
    kw = _cache_kwarg(hf)
    cache = StaticCache(config=hf.config, max_cache_len=context + warmup + steps)
    if backend == "inductor":
        forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
        how = "torch.compile(forward, mode='reduce-overhead', fullgraph=True) decode"
    elif backend is not None:
        forward = torch.compile(hf.forward, backend=backend, fullgraph=True)
        how = f"torch.compile(forward, backend={backend!r}, fullgraph=True) decode"
    else:
        forward, how = hf.forward, "eager decode (backend=None)"

    ids = _prompt(hf.config.vocab_size, context, seed, device)
    toks = torch.empty(warmup + steps + 1, dtype=torch.long, device=device)
    sync = _sync(device)
    sync()
    t0 = time.perf_counter()
    nxt = hf(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[:, -1:].argmax(-1)
    sync()
    prefill_s = time.perf_counter() - t0
    toks[0] = nxt[0, 0]
    t0 = time.perf_counter()
    nxt = _greedy_step(forward, tok=nxt, **{kw: cache})
    sync()
    compile_s = time.perf_counter() - t0
    toks[1] = nxt[0, 0]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(1, warmup + steps):
            if i == warmup:
                sync()
                t0 = time.perf_counter()
            nxt = _greedy_step(forward, tok=nxt, **{kw: cache})
            toks[i + 1] = nxt[0, 0]
        sync()
    ms = (time.perf_counter() - t0) / steps * 1e3
    res = DecodeBaseline(recipe=f"StaticCache, eager prefill, {how}", context=context, steps=steps,
                         warmup=warmup, prefill_s=prefill_s, ms_per_token=ms, attn_implementation=str(hf.config._attn_implementation),
                         dtype=str(hf.dtype), transformers=transformers.__version__, torch=torch.__version__,
                         compile_s=compile_s if backend is not None else None, tokens=toks.tolist())
    del hf, cache, forward, toks, nxt
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return res
