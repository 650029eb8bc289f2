"""FP8 KV cache quality at long context: MOSS-TD full shape (dummy weights, bf16), teacher-forced decode,
bf16 KV vs FP8 KV on the same weights and the same forced tokens.

For each context length (prompt of random token ids), both engines prefill the prompt and decode ``--steps``
forced tokens; at every step the logits of a fixed probe of vocabulary ids are recorded with the full
vocabulary's top-1. Reported per context: relative error of the FP8 logits against the bf16 logits
(``||a - b|| / ||b||`` over the probe; mean, p99, max) and top-1 agreement. Random weights are not a
trained model's attention patterns: this bounds what the cache's rounding does to a full-size stack at
these depths, not a real checkpoint's quality (docs/service.md, "FP8 KV cache").

Run on the GPU machine:  python3 benchmarks/eval_fp8_kv.py --contexts 35000,90000 --steps 2000 \\
                           --out benchmarks/results/eval_fp8_kv_h200.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_engine import json_saver, result_header

from engine import Engine, EngineConfig, Sequence
from engine.loaders import LoadedModel

VOCAB = 151_936
PROBE = 8192


def _teacher_forced(engine: Engine, prompt: list[int], steps: int, probe: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Probe logits float32 ``[steps, PROBE]`` and full-vocabulary top-1 per step, forcing token
    ``(7919 * step + 17) % 150_000`` at each step (modulo the vocabulary of a smaller shape)."""
    rows: list[torch.Tensor] = []
    top1: list[int] = []

    def proc(seq, logits):
        rows.append(logits[probe].float().cpu())
        top1.append(int(logits.argmax()))
        forced = torch.full_like(logits, -1e9)
        forced[(7919 * len(seq.output_ids) + 17) % min(150_000, logits.numel())] = 0.0
        return forced

    seq = Sequence(prompt_ids=prompt, max_new_tokens=steps, ignore_eos=True, logits_processor=proc)
    engine.generate([seq])
    return torch.stack(rows), top1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="35000,90000", help="prompt lengths (tokens), comma-separated")
    ap.add_argument("--steps", type=int, default=2000, help="forced decode steps per context")
    ap.add_argument("--commit", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="the CI-sized MOSS-TD dummy shape (smoke runs)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    res = result_header(args.commit) if args.device == "cuda" else {"command": " ".join(sys.argv)}
    res.update(model="moss-td full shape, dummy weights (seed 0), bfloat16", steps=args.steps, probe_ids=PROBE,
               contexts={})
    save = json_saver(res, args.out)
    contexts = [int(c) for c in args.contexts.split(",")]
    budget = int((max(contexts) + args.steps + 64) * 114_688 * 1.1)
    from engine.loaders.moss_td import TINY_DUMMY_CONFIG

    base = {"model": "moss-td", "load_format": "dummy", "device": args.device, "dtype": "bfloat16",
            "kv_budget_bytes": budget, "max_running_requests": 4, "seed": 0,
            "dummy_config": TINY_DUMMY_CONFIG if args.tiny else {}}
    bf16 = Engine(EngineConfig(**base))
    model = copy.deepcopy(bf16.model)
    f8 = Engine(EngineConfig(**{**base, "load_format": "auto"}, kv_dtype="fp8_e4m3"),
                loaded=LoadedModel(model, bf16.tokenizer, bf16.loaded.info))
    assert f8.kv.quantized and not bf16.kv.quantized
    gen = torch.Generator().manual_seed(0)
    vocab = bf16.model.config.text.vocab_size
    probe = torch.randperm(vocab, generator=gen)[:PROBE]
    for ctx in contexts:
        prompt = torch.randint(0, min(150_000, vocab), (ctx,), generator=gen).tolist()
        t0 = time.perf_counter()
        a, ta = _teacher_forced(bf16, prompt, args.steps, probe)
        b, tb = _teacher_forced(f8, prompt, args.steps, probe)
        rel = ((b - a).norm(dim=1) / a.norm(dim=1)).numpy()
        res["contexts"][str(ctx)] = {
            "rel_err_mean": float(rel.mean()), "rel_err_p99": float(np.quantile(rel, 0.99)),
            "rel_err_max": float(rel.max()), "top1_agreement": float(np.mean(np.array(ta) == np.array(tb))),
            "max_abs_logit_diff": float((b - a).abs().max()), "wall_s": time.perf_counter() - t0}
        print(ctx, json.dumps(res["contexts"][str(ctx)]), flush=True)
        save()
    print(json.dumps(res, indent=1))
    save()


if __name__ == "__main__":
    main()
